#!/usr/bin/env python3
"""The encoder variants at a base size on the GPU: anatomy against the Hugging Face Trainer in the
same call, each side in its own process (NVML memory is per process).

    python3 bench/family_bench.py --anatomy-bin BIN [--presets roberta-base,...] [--seq 512]
                                  [--batch 32] [--samples 1024] [--out DIR]
    python3 bench/family_bench.py --hf PRESET --seq S --batch B --samples N     (one HF run, one JSON line)

For each preset (default roberta-base, xlm-roberta-base, distilbert-base, electra-base,
bert-base): `anatomy train --preset P --precision bf16` on random ids, then the Trainer on the
same shape (AutoModelForSequenceClassification from the same config, SDPA attention, bf16 + tf32,
fused AdamW, one epoch of dummy samples). Steady samples/s: optimizer steps from the middle of the
run to its end. Prints a markdown table (also DIR/family_bench.md) and one JSON line per run
(DIR/family_bench.jsonl).
"""
import argparse
import json
import os
import subprocess
import sys
import time

# The transformers configs of the presets (src/model/config.cpp BertConfig::preset).
HF_CONFIGS = {
    "bert-base": ("BertConfig", {}),
    "roberta-base": ("RobertaConfig", dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
                                           pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)),
    "xlm-roberta-base": ("XLMRobertaConfig", dict(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1,
                                                  pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)),
    "distilbert-base": ("DistilBertConfig", {}),
    "electra-small": ("ElectraConfig", dict(embedding_size=128, hidden_size=256, num_attention_heads=4,
                                            intermediate_size=1024)),
    "electra-base": ("ElectraConfig", dict(embedding_size=768, hidden_size=768, num_attention_heads=12,
                                           intermediate_size=3072)),
    "modernbert-base": ("ModernBertConfig", {}),  # its defaults are ModernBERT-base's shape
}


def gpu_used_mb():
    from pynvml import nvmlDeviceGetHandleByIndex, nvmlDeviceGetMemoryInfo, nvmlInit
    nvmlInit()
    return nvmlDeviceGetMemoryInfo(nvmlDeviceGetHandleByIndex(0)).used // 1024**2


def hf_run(preset, seq, batch, samples):
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, Trainer, TrainerCallback, TrainingArguments
    transformers.logging.set_verbosity_error()
    cls, kw = HF_CONFIGS[preset]
    cfg = getattr(transformers, cls)(num_labels=2, **kw)
    cfg._attn_implementation = "sdpa"
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(5, min(cfg.vocab_size, 30000), (samples, seq)))
    ds = [{"input_ids": ids[i], "labels": torch.tensor(0)} for i in range(samples)]
    model = AutoModelForSequenceClassification.from_config(cfg).to("cuda")
    stamps = []

    class StepTimer(TrainerCallback):
        def on_step_end(self, args, state, control, **k):
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    args = TrainingArguments(output_dir="/tmp/family_bench_hf", per_device_train_batch_size=batch,
                             num_train_epochs=1, bf16=True, tf32=True, optim="adamw_torch_fused",
                             log_level="error", report_to="none", save_strategy="no", logging_strategy="no")
    r = Trainer(model=model, args=args, train_dataset=ds, callbacks=[StepTimer()]).train()
    half = len(stamps) // 2
    steady = (len(stamps) - 1 - half) * batch / (stamps[-1] - stamps[half]) if len(stamps) > 3 else None
    return dict(side="hf", preset=preset, seq=seq, batch=batch, samples=samples,
                samples_per_s=round(r.metrics["train_samples_per_second"], 2),
                steady_samples_per_s=round(steady, 2) if steady else None, gpu_mem_used_mb=gpu_used_mb(),
                torch_max_alloc_mb=torch.cuda.max_memory_allocated() // 1024**2,
                train_loss=r.metrics.get("train_loss"))


def anatomy_run(binary, preset, seq, batch, samples, timeout):
    out = f"/tmp/family_bench/{preset}"
    cmd = [binary, "train", "--device", "cuda", "--preset", preset, "--precision", "bf16", "--seq-len", str(seq),
           "--per-device-train-batch-size", str(batch), "--num-samples", str(samples), "--disable-tqdm",
           "--logging-steps", "0", "--save-strategy", "no", "--overwrite-output-dir", "--output-dir", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    rec = dict(side="anatomy", preset=preset, seq=seq, batch=batch, samples=samples)
    if p.returncode != 0:
        rec["error"] = (p.stdout + p.stderr).strip().splitlines()[-1:] or [f"exit {p.returncode}"]
        return rec
    with open(os.path.join(out, "train_results.json")) as f:
        j = json.load(f)
    rec.update(samples_per_s=j.get("train_samples_per_second"), steady_samples_per_s=j.get("steady_samples_per_second"),
               gpu_mem_used_mb=j.get("gpu_memory_occupied_mb"), train_loss=j.get("train_loss"))
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anatomy-bin")
    ap.add_argument("--hf")
    ap.add_argument("--presets", default="roberta-base,xlm-roberta-base,distilbert-base,electra-base,bert-base")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--out", default="bench/results/tmp")
    a = ap.parse_args()
    if a.hf:
        print(json.dumps(hf_run(a.hf, a.seq, a.batch, a.samples)), flush=True)
        return
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for preset in a.presets.split(","):
        rows.append(anatomy_run(a.anatomy_bin, preset, a.seq, a.batch, a.samples, a.timeout))
        p = subprocess.run([sys.executable, __file__, "--hf", preset, "--seq", str(a.seq), "--batch", str(a.batch),
                            "--samples", str(a.samples)], capture_output=True, text=True, timeout=a.timeout)
        try:
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError):
            rows.append(dict(side="hf", preset=preset, error=(p.stderr.strip().splitlines() or ["no output"])[-1]))
        for r in rows[-2:]:
            print(json.dumps(r), flush=True)
    lines = [f"bf16, batch {a.batch}, seq {a.seq}, {a.samples} random samples",
             "", "| preset | side | samples/s (steady) | ratio anatomy/HF | NVML used MB | train loss |",
             "|---|---|---|---|---|---|"]
    for i in range(0, len(rows), 2):
        an, hf = rows[i], rows[i + 1]
        ratio = (round(an["steady_samples_per_s"] / hf["steady_samples_per_s"], 2)
                 if an.get("steady_samples_per_s") and hf.get("steady_samples_per_s") else "-")
        for r in (an, hf):
            lines.append(f"| {r['preset']} | {r['side']} | {r.get('steady_samples_per_s', r.get('error'))} | "
                         f"{ratio if r is an else ''} | {r.get('gpu_mem_used_mb', '-')} | {r.get('train_loss', '-')} |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "family_bench.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "family_bench.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
