#!/usr/bin/env python3
"""Hugging Face anchor: the seed experiment of "Model training anatomy" (HF Trainer,
bert-large with random weights, seq 512, dummy data) and stronger plain-PyTorch loops.

    python3 bench/hf_anchor.py CONFIG [--n SAMPLES] [--steps STEPS]   -> one JSON line
    python3 bench/hf_anchor.py --all [--timeout S]   -> DEFAULT configs, one subprocess each
    python3 bench/hf_anchor.py --list

Run every configuration in its own process (memory figures are per process: NVML "used"
is read exactly as nvidia-smi reports it). Configurations:

  seed_fp32_bs4 / seed_fp32_bs4_eager   Trainer fp32, batch 4, 512 samples (the seed)
  tf32_bs4, bf16_bs4                    Trainer tf32 / bf16 mixed precision, batch 4
  bf16_bs32_fused                       Trainer bf16+tf32, batch 32, fused AdamW, 1024 samples
  bf16_bs32_ckpt                        same with gradient checkpointing
  bf16_bs8_accum4                       bf16, batch 8 x 4 accumulation steps
  torch_bf16_bs{N}                      plain PyTorch loop (SDPA, bf16 autocast, fused AdamW),
                                        40 steps of batch N; any N (16, 32, 48, 64 listed)
  torch_bf16_bs{N}_compile              same with torch.compile (slow to start; not default)

Steady samples/s: optimizer steps from the middle of the run to the end, timed with
torch.cuda.synchronize() at every step end. MFU: 1.005e12 FLOP/sample over 989e12 FLOP/s.
A configuration that runs out of memory prints {"config":..., "error": "OOM ..."} and exits 2.
"""
import argparse
import json
import re
import sys
import time

FLOP_PER_SAMPLE = 3 * 512 * 24 * (24 * 1024**2 + 4 * 512 * 1024)  # fwd+bwd matmul flops
PEAK_FLOPS = 989e12  # H100 SXM dense bf16
SEQ = 512


def gpu_used_mb():
    from pynvml import nvmlInit, nvmlDeviceGetHandleByIndex, nvmlDeviceGetMemoryInfo
    nvmlInit()
    return nvmlDeviceGetMemoryInfo(nvmlDeviceGetHandleByIndex(0)).used // 1024**2


class ClockSampler:
    """NVML's SM clock, power and clock event reasons every 0.1 s in a thread, summarized over
    the steady steps as anatomy's train_results.json does (Note [clock and power] in
    src/telemetry/clocks.h): gpu_sm_clock_mhz_median, gpu_power_w_median, gpu_power_capped_share."""

    def __init__(self):
        import threading
        self.samples, self.stop_flag = [], threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nv, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            self.nv = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        nv = self.nv
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        while not self.stop_flag.is_set():
            try:
                self.samples.append((time.perf_counter(), nv.nvmlDeviceGetClockInfo(self.h, nv.NVML_CLOCK_SM),
                                     nv.nvmlDeviceGetPowerUsage(self.h) / 1000.0, reasons(self.h)))
            except Exception:
                return
            time.sleep(0.1)

    def __enter__(self):
        if self.nv:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        if self.nv:
            self.thread.join()

    def summary(self, t_from, t_to):
        import statistics
        w = [s for s in self.samples if t_from <= s[0] <= t_to]
        if not w:
            return {}
        return dict(gpu_sm_clock_mhz_median=statistics.median(s[1] for s in w),
                    gpu_power_w_median=round(statistics.median(s[2] for s in w), 1),
                    gpu_power_capped_share=round(sum(1 for s in w if s[3] & (0x4 | 0x80)) / len(w), 3))


def bert_large(attn="sdpa"):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
                     num_attention_heads=16, intermediate_size=4096,
                     max_position_embeddings=512, type_vocab_size=2, num_labels=2)
    cfg._attn_implementation = attn
    return BertForSequenceClassification(cfg)


def mfu(samples_per_s):
    return round(samples_per_s * FLOP_PER_SAMPLE / PEAK_FLOPS, 3)


def trainer_run(name, bs, n=512, attn="sdpa", **kw):
    """The seed's measurement: HF Trainer over n dummy samples, one epoch."""
    import numpy as np
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments, logging
    logging.set_verbosity_error()
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(100, 30000, (n, SEQ)))
    labels = torch.from_numpy(rng.integers(0, 1, n))
    ds = [{"input_ids": ids[i], "labels": labels[i]} for i in range(n)]  # no `datasets` there
    base = gpu_used_mb()
    torch.ones((1, 1)).to("cuda")
    ctx = gpu_used_mb()
    model = bert_large(attn).to("cuda")
    weights = gpu_used_mb()
    per_step = bs * kw.get("gradient_accumulation_steps", 1)  # samples per optimizer step
    stamps = []

    class StepTimer(TrainerCallback):
        def on_step_end(self, args, state, control, **k):
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    args = TrainingArguments(output_dir="/tmp/hf_anchor", per_device_train_batch_size=bs,
                             num_train_epochs=1, log_level="error", report_to="none",
                             save_strategy="no", logging_strategy="no", **kw)
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[StepTimer()])
    with ClockSampler() as clocks:
        r = trainer.train()
    half = len(stamps) // 2
    steady = ((len(stamps) - 1 - half) * per_step / (stamps[-1] - stamps[half])
              if len(stamps) > 3 else None)
    out = dict(config=name, kind="trainer", bs=bs, samples=n,
               time_s=round(r.metrics["train_runtime"], 2),
               samples_per_s=round(r.metrics["train_samples_per_second"], 2),
               steady_samples_per_s=round(steady, 2) if steady else None,
               gpu_mem_used_mb=gpu_used_mb(), mem_ctx_mb=ctx - base, mem_weights_mb=weights - ctx,
               torch_max_alloc_mb=torch.cuda.max_memory_allocated() // 1024**2,
               torch_max_reserved_mb=torch.cuda.max_memory_reserved() // 1024**2,
               train_loss=r.metrics.get("train_loss"))
    if steady:
        out["mfu_steady"] = mfu(steady)
        out.update(clocks.summary(stamps[half], stamps[-1]))
    return out


def torch_loop(name, bs, steps=40, compile=False, ckpt=False):
    """Plain PyTorch: SDPA, bf16 autocast, TF32 matmuls, fused AdamW, one fixed batch on GPU."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    model = bert_large("sdpa").to("cuda")
    if ckpt:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    f = torch.compile(model) if compile else model
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(100, 30000, (bs, SEQ), device="cuda", generator=g)
    y = torch.zeros(bs, dtype=torch.long, device="cuda")
    t = []
    t0 = time.perf_counter()
    with ClockSampler() as clocks:
        for _ in range(steps):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = f(input_ids=x, labels=y).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            t.append(time.perf_counter())
    h = steps // 2
    sps = (steps - 1 - h) * bs / (t[-1] - t[h])
    return dict(config=name, kind="torch_loop", bs=bs, steps=steps,
                time_s=round(t[-1] - t0, 2),
                samples_per_s=round(steps * bs / (t[-1] - t0), 2),
                steady_samples_per_s=round(sps, 2), mfu_steady=mfu(sps),
                gpu_mem_used_mb=gpu_used_mb(),
                torch_max_alloc_mb=torch.cuda.max_memory_allocated() // 1024**2,
                torch_max_reserved_mb=torch.cuda.max_memory_reserved() // 1024**2,
                train_loss=float(loss), **clocks.summary(t[h], t[-1]))


FUSED = dict(bf16=True, tf32=True, optim="adamw_torch_fused")
TRAINER_CONFIGS = {
    # name: (batch, default samples, TrainingArguments extras)
    "seed_fp32_bs4": (4, 512, {}),
    "seed_fp32_bs4_eager": (4, 512, {"attn": "eager"}),
    "tf32_bs4": (4, 512, {"tf32": True}),
    "bf16_bs4": (4, 512, {"bf16": True}),
    "bf16_bs32_fused": (32, 1024, dict(FUSED)),
    "bf16_bs32_ckpt": (32, 1024, dict(FUSED, gradient_checkpointing=True)),
    "bf16_bs8_accum4": (8, 1024, dict(FUSED, gradient_accumulation_steps=4)),
}
TORCH_RE = re.compile(r"^torch_bf16_bs(\d+)(_compile)?(_ckpt)?$")
LISTED = list(TRAINER_CONFIGS) + [f"torch_bf16_bs{b}" for b in (16, 32, 48, 64)] + [
    "torch_bf16_bs32_compile", "torch_bf16_bs64_compile"]
# What the DESIGN.md anchor table runs (no torch.compile: too slow for the device budget).
DEFAULT = ["seed_fp32_bs4", "tf32_bs4", "bf16_bs4", "bf16_bs32_fused", "bf16_bs32_ckpt",
           "torch_bf16_bs16", "torch_bf16_bs32", "torch_bf16_bs48", "torch_bf16_bs64"]


def run_config(name, n=None, steps=None):
    if name in TRAINER_CONFIGS:
        bs, n_default, extra = TRAINER_CONFIGS[name]
        return trainer_run(name, bs, n=n or n_default, **dict(extra))
    m = TORCH_RE.match(name)
    if m:
        return torch_loop(name, int(m.group(1)), steps=steps or 40,
                          compile=bool(m.group(2)), ckpt=bool(m.group(3)))
    raise SystemExit(f"unknown config {name!r}; known: {', '.join(LISTED)} (torch_bf16_bs<N>[_compile][_ckpt])")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?")
    ap.add_argument("--n", type=int, help="samples for Trainer configs (default per config)")
    ap.add_argument("--steps", type=int, help="steps for torch_bf16_* loops (default 40)")
    ap.add_argument("--list", action="store_true", help="print listed and default configs")
    ap.add_argument("--all", action="store_true", help="run the DEFAULT configs, each in its own process")
    ap.add_argument("--timeout", type=int, default=300, help="per-config timeout for --all (s)")
    a = ap.parse_args()
    if a.all:
        import subprocess
        for name in DEFAULT:
            cmd = [sys.executable, __file__, name]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
                print(lines[-1] if lines else json.dumps(
                    {"config": name, "error": f"rc {p.returncode}: {p.stderr[-300:]}"}), flush=True)
            except subprocess.TimeoutExpired:
                print(json.dumps({"config": name, "error": f"timeout {a.timeout}s"}), flush=True)
        return
    if a.list or not a.config:
        print(json.dumps({"listed": LISTED, "default": DEFAULT}))
        return
    try:
        out = run_config(a.config, n=a.n, steps=a.steps)
    except Exception as e:  # OOM and friends: still one JSON line
        try:
            import torch
            oom = isinstance(e, torch.cuda.OutOfMemoryError)
        except ImportError:
            oom = False
        err = {"config": a.config, "error": ("OOM " if oom else "") + f"{type(e).__name__}: {str(e)[:300]}"}
        try:
            err["gpu_mem_used_mb"] = gpu_used_mb()
        except Exception:
            pass
        print(json.dumps(err), flush=True)
        sys.exit(2)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
