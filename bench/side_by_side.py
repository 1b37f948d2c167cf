#!/usr/bin/env python3
"""Side-by-side benchmark: Hugging Face anchor vs anatomy, same GPU, same run.

    python3 bench/side_by_side.py [--out DIR] [--configs seed,bf16_bs4,bf16_bs32,best]
                                  [--batches 16,32,48,64] [--only all|hf|anatomy] [--quick]
                                  [--anatomy-bin build/anatomy] [--timeout S] [--budget S]

Every measurement runs in its own subprocess, one after another, each with a timeout:
the HF side through bench/hf_anchor.py CONFIG, the anatomy side as

    ANATOMY train --preset bert-large --seq-len 512 --num-samples N
                  --per-device-train-batch-size BS --precision P --num-train-epochs 1
                  --device cuda --output-dir DIR --save-strategy no --logging-steps 0

reading DIR/train_results.json (train_runtime, train_samples_per_second,
steady_samples_per_second, gpu_memory_occupied_mb, train_loss).

Configurations (--configs):
  seed      fp32 batch 4, 512 samples, one epoch  (HF: Trainer fp32 = the seed experiment)
  tf32      tf32 batch 4, 512 samples             (HF: Trainer tf32)              [optional]
  bf16_bs4  bf16 batch 4, 512 samples             (HF: Trainer bf16)
  bf16_bs32 bf16 batch 32, 1024 samples           (HF: Trainer bf16 fused AdamW, torch loop)
  fp8_bs32  anatomy fp8 and bf16 at batch 32, alternated twice (HF: the torch loop in bf16)
  best      bf16, every batch in --batches        (HF: torch loop; anatomy: max(1024, 32*BS) samples)
The ratio column is anatomy's steady samples/s over the best HF steady samples/s of the
same configuration (for "best": over HF's best batch). MFU = steady samples/s x 1.005e12
FLOP per sample / 989e12 FLOP/s (H100 dense bf16 peak).

Output (--out, default $OUT or bench/results/tmp):
  side_by_side.jsonl   a meta line, then one JSON line per run, appended as each finishes
  side_by_side.md      the table (rewritten after every run, so a timeout loses nothing)
  logs/                stdout/stderr of every run; anatomy_runs/NAME/ anatomy's output dirs
With --resume A.jsonl [B.jsonl ...] successful runs recorded there are reused (copied into the
new jsonl, marked "resumed") instead of rerun: split a long benchmark over several device
calls (e.g. --only hf, then --only anatomy --resume hf/side_by_side.jsonl for one table), or
finish one that hit its time limit.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HF_ANCHOR = os.path.join(REPO, "bench", "hf_anchor.py")
FLOP_PER_SAMPLE = 3 * 512 * 24 * (24 * 1024**2 + 4 * 512 * 1024)  # 1.005e12, fwd+bwd matmuls
PEAK_FLOPS = 989e12

CONFIG_TITLES = {
    "seed": "(a) seed fp32 bs4",
    "seed_selective": "(a) seed fp32 bs4, anatomy recomputing GELU (selective)",
    "seed_own": "(a) seed fp32 bs4, anatomy with gradients in a buffer of their own",
    "tf32": "(a') tf32 bs4",
    "bf16_bs4": "(b) bf16 bs4",
    "bf16_bs32": "(c) bf16 bs32",
    "best": "(d) bf16 best batch",
    "layer_bs32": "(e) bf16 bs32, layer gradient checkpointing",
    "fp8_bs32": "(f) bs32: anatomy --precision fp8 (the encoder's Linear layers in fp8) next to its bf16, vs the PyTorch loop in bf16",
}


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def nvml_info():
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        drv = pynvml.nvmlSystemGetDriverVersion()
        dec = lambda s: s.decode() if isinstance(s, bytes) else s
        return {"gpu": dec(name), "driver": dec(drv),
                "nvml_used_mb_idle": pynvml.nvmlDeviceGetMemoryInfo(h).used // 1024**2}
    except Exception as e:
        return {"gpu": None, "nvml_error": str(e)[:200]}


def run_proc(cmd, timeout, log_prefix):
    """Run cmd in its own process group; kill the group on timeout. Returns (rc, out, err, secs)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=REPO, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        rc = "timeout"
    secs = time.perf_counter() - t0
    for ext, text in (("out", out), ("err", err)):
        with open(f"{log_prefix}.{ext}", "w") as f:
            f.write(text or "")
    return rc, out or "", err or "", secs


class Bench:
    def __init__(self, a):
        self.a = a
        self.out = a.out
        os.makedirs(os.path.join(self.out, "logs"), exist_ok=True)
        self.rows = []      # one per (config, run)
        self.cache = {}     # run key -> record (a run shared by two configs runs once)
        for path in a.resume or []:  # successful runs of earlier invocations are reused
            with open(path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if rec.get("key") and not rec.get("error") and rec.get("steady") is not None:
                        self.cache[rec["key"]] = dict(rec, resumed_from=path)
        self.jsonl = open(os.path.join(self.out, "side_by_side.jsonl"), "w")
        self.t_start = time.perf_counter()

    def emit(self, rec):
        line = json.dumps(rec)
        self.jsonl.write(line + "\n")
        self.jsonl.flush()
        os.fsync(self.jsonl.fileno())
        print(line, flush=True)

    def time_left(self):
        if not self.a.budget:
            return self.a.timeout
        return min(self.a.timeout, self.a.budget - (time.perf_counter() - self.t_start))

    # ---- one run of each side -------------------------------------------------------------
    def hf(self, name, bs, n=None, steps=None):
        key = f"hf:{name}:n={n}:steps={steps}"
        if key in self.cache:
            return self.reuse(key)
        rec = {"key": key, "side": "hf", "name": name, "started": now(), "batch": bs}
        limit = self.time_left()
        if limit < 20:
            rec.update(error="skipped: out of budget")
        else:
            cmd = [sys.executable, HF_ANCHOR, name]
            if n:
                cmd += ["--n", str(n)]
            if steps:
                cmd += ["--steps", str(steps)]
            rec["cmd"] = " ".join(shlex.quote(c) for c in cmd)
            rc, out, err, secs = run_proc(cmd, limit, os.path.join(self.out, "logs", f"hf_{name}"))
            rec.update(rc=rc, wall_s=round(secs, 1))
            lines = [l for l in out.splitlines() if l.strip().startswith("{")]
            try:
                res = json.loads(lines[-1])
                rec["result"] = res
                if "error" in res:
                    rec["error"] = res["error"]
            except Exception:
                rec["error"] = f"no JSON result (rc {rc})"
                rec["stderr_tail"] = err[-1500:]
            r = rec.get("result", {})
            rec.update(clock_mhz=r.get("gpu_sm_clock_mhz_median"),
                       batch=r.get("bs", bs), steady=r.get("steady_samples_per_s"),
                       run_sps=r.get("samples_per_s"), time_s=r.get("time_s"),
                       mem_mb=r.get("gpu_mem_used_mb"), loss=r.get("train_loss"))
        self.emit(rec)
        self.cache[key] = rec
        return rec

    def reuse(self, key):
        rec = self.cache[key]
        if rec.pop("resumed_from", None):  # first use of a resumed record: copy it to this jsonl
            rec["resumed"] = True
            self.emit(rec)
        return rec

    def anatomy(self, precision, bs, n, ckpt="none", placement="auto"):
        name = (f"{precision}_bs{bs}_n{n}" + ("" if ckpt == "none" else f"_{ckpt}")
                + ("" if placement == "auto" else f"_grads_{placement}"))
        key = f"anatomy:{name}:{self.a.anatomy_args}"
        if key in self.cache:
            return self.reuse(key)
        rec = {"key": key, "side": "anatomy", "name": name, "started": now(), "batch": bs}
        limit = self.time_left()
        run_dir = os.path.join(self.out, "anatomy_runs", name)
        if limit < 20:
            rec.update(error="skipped: out of budget")
        elif not os.path.exists(self.a.anatomy_bin):
            rec.update(error=f"binary not found: {self.a.anatomy_bin}")
        else:
            os.makedirs(run_dir, exist_ok=True)
            results_path = os.path.join(run_dir, "train_results.json")
            if os.path.exists(results_path):
                os.remove(results_path)
            cmd = [self.a.anatomy_bin, "train", "--preset", "bert-large", "--seq-len", "512",
                   "--num-samples", str(n), "--per-device-train-batch-size", str(bs),
                   "--precision", precision, "--num-train-epochs", "1", "--device", "cuda",
                   "--output-dir", run_dir, "--save-strategy", "no", "--logging-steps", "0",
                   "--gradient-checkpointing", ckpt, "--gradient-placement", placement]
            cmd += shlex.split(self.a.anatomy_args)
            rec["cmd"] = " ".join(shlex.quote(c) for c in cmd)
            rc, out, err, secs = run_proc(cmd, limit, os.path.join(self.out, "logs", f"anatomy_{name}"))
            rec.update(rc=rc, wall_s=round(secs, 1))
            try:
                with open(results_path) as f:
                    res = json.load(f)
                rec["result"] = res
            except Exception as e:
                res = {}
                rec["error"] = f"no train_results.json ({type(e).__name__}; rc {rc})"
            if rc != 0 and "error" not in rec:
                rec["error"] = f"rc {rc}"
            if "error" in rec:
                rec["stderr_tail"] = (err or out)[-1500:]

            def num(*keys):
                for k in keys:
                    v = res.get(k)
                    if isinstance(v, (int, float)):
                        return v
                return None
            rec.update(clock_mhz=num("gpu_sm_clock_mhz_median"), steady=num("steady_samples_per_second"),
                       run_sps=num("train_samples_per_second"),
                       time_s=num("train_runtime"), mem_mb=num("gpu_memory_occupied_mb"),
                       loss=num("train_loss"))
        self.emit(rec)
        self.cache[key] = rec
        return rec

    # ---- configurations ------------------------------------------------------------------
    def add(self, config, rec):
        self.rows.append((config, rec))
        self.write_table()

    def run(self):
        a, q = self.a, self.a.quick
        do_hf, do_an = a.only in ("all", "hf"), a.only in ("all", "anatomy")
        n4 = 128 if q else 512
        n32 = 256 if q else 1024
        steps = 12 if q else None  # hf_anchor default: 40
        for config in a.configs:
            if config == "seed":
                if do_hf: self.add(config, self.hf("seed_fp32_bs4", 4, n=n4 if q else None))
                if do_an: self.add(config, self.anatomy("fp32", 4, n4))
            elif config == "seed_selective":  # anatomy only: the seed with the GELU output recomputed
                if do_an: self.add(config, self.anatomy("fp32", 4, n4, ckpt="selective"))
            elif config == "seed_own":  # anatomy only: the seed without gradients in freed activations
                if do_an: self.add(config, self.anatomy("fp32", 4, n4, placement="own"))
            elif config == "layer_bs32":
                if do_hf: self.add(config, self.hf("bf16_bs32_ckpt", 32, n=n32 if q else None))
                if do_an: self.add(config, self.anatomy("bf16", 32, n32, ckpt="layer"))
            elif config == "tf32":
                if do_hf: self.add(config, self.hf("tf32_bs4", 4, n=n4 if q else None))
                if do_an: self.add(config, self.anatomy("tf32", 4, n4))
            elif config == "bf16_bs4":
                if do_hf: self.add(config, self.hf("bf16_bs4", 4, n=n4 if q else None))
                if do_an: self.add(config, self.anatomy("bf16", 4, n4))
            elif config == "bf16_bs32":
                if do_hf:
                    if not a.no_trainer_bs32:
                        self.add(config, self.hf("bf16_bs32_fused", 32, n=n32 if q else None))
                    self.add(config, self.hf("torch_bf16_bs32", 32, steps=steps))
                if do_an: self.add(config, self.anatomy("bf16", 32, n32))
            elif config == "fp8_bs32":  # fp8 next to bf16, twice each alternated, against PyTorch's bf16 loop
                if do_hf: self.add(config, self.hf("torch_bf16_bs32", 32, steps=steps))
                if do_an:
                    for n in (n32, n32 + 32):  # two sample counts: distinct runs, not the cache
                        self.add(config, self.anatomy("bf16", 32, n))
                        self.add(config, self.anatomy("fp8", 32, n))
            elif config == "best":
                if do_hf:
                    for bs in a.hf_batches:
                        self.add(config, self.hf(f"torch_bf16_bs{bs}", bs, steps=steps))
                if do_an:
                    for bs in a.anatomy_batches:
                        n = max(256, 8 * bs) if q else max(1024, 32 * bs)
                        self.add(config, self.anatomy("bf16", bs, n))
            else:
                raise SystemExit(f"unknown config {config!r}; known: {', '.join(CONFIG_TITLES)}")
        self.write_table()
        print(open(os.path.join(self.out, "side_by_side.md")).read(), flush=True)

    # ---- table ---------------------------------------------------------------------------
    def write_table(self):
        fmt = lambda v, d=1: "n/a" if not isinstance(v, (int, float)) else f"{v:.{d}f}"
        hdr = ("| config | side | batch | samples/s (steady) | ratio anatomy/HF-best | MFU | NVML used MB "
               "| SM clock MHz (steady, median) | J a sample (median W / steady samples/s) | samples/s (whole run) "
               "| train s | note |")
        lines = [hdr, "|" + "---|" * 12]
        for config in dict.fromkeys(c for c, _ in self.rows):
            recs = [r for c, r in self.rows if c == config]
            hf_vals = [r["steady"] for r in recs if r["side"] == "hf" and isinstance(r.get("steady"), (int, float))]
            an_vals = [r["steady"] for r in recs if r["side"] == "anatomy" and isinstance(r.get("steady"), (int, float))]
            hf_best = max(hf_vals) if hf_vals else None
            an_best = max(an_vals) if an_vals else None
            for r in recs:
                s = r.get("steady")
                ok = isinstance(s, (int, float))
                ratio = (f"{s / hf_best:.2f}" if r["side"] == "anatomy" and ok and hf_best else
                         ("—" if r["side"] == "hf" else "n/a"))
                mfu = f"{s * FLOP_PER_SAMPLE / PEAK_FLOPS:.3f}" if ok else "n/a"
                # At the board's power limit samples/s is watts over joules a sample (README, "How far from 2x").
                watts = (r.get("result") or {}).get("gpu_power_w_median")  # both sides' results name it so
                joules = watts / s if ok and s > 0 and isinstance(watts, (int, float)) else None
                note = r["name"]
                best = hf_best if r["side"] == "hf" else an_best
                if ok and s == best and len(hf_vals if r["side"] == "hf" else an_vals) > 1:
                    note += " **best**"
                if r.get("error"):
                    note += " — " + str(r["error"]).replace("|", "/").replace("\n", " ")[:120]
                    tail = [l for l in (r.get("stderr_tail") or "").splitlines() if l.strip()]
                    if tail:
                        note += " — " + tail[-1].replace("|", "/")[:120]
                lines.append(f"| {CONFIG_TITLES.get(config, config)} | {r['side']} | {r.get('batch') or 'n/a'} "
                             f"| {fmt(s)} | {ratio} | {mfu} | {fmt(r.get('mem_mb'), 0)} | {fmt(r.get('clock_mhz'), 0)} "
                             f"| {fmt(joules, 3)} | {fmt(r.get('run_sps'))} | {fmt(r.get('time_s'))} | {note} |")
            if config == "best" and hf_best and an_best:
                lines.append(f"| {CONFIG_TITLES['best']} | **best vs best** | | {an_best:.1f} vs {hf_best:.1f} "
                             f"| {an_best / hf_best:.2f} | {an_best * FLOP_PER_SAMPLE / PEAK_FLOPS:.3f} | | | | | | |")
        text = "\n".join(lines) + "\n"
        tmp = os.path.join(self.out, "side_by_side.md.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(self.out, "side_by_side.md"))


def meta(a):
    m = {"meta": True, "date": now(), "host": platform.node(), "argv": sys.argv[1:],
         "anatomy_bin": a.anatomy_bin, **nvml_info()}
    try:
        p = subprocess.run([sys.executable, "-c",
                            "import torch, transformers; print(torch.__version__, transformers.__version__, "
                            "torch.version.cuda)"], capture_output=True, text=True, timeout=120)
        m["torch"], m["transformers"], m["torch_cuda"] = p.stdout.split()[:3]
    except Exception as e:
        m["versions_error"] = str(e)[:200]
    try:
        m["git"] = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True, timeout=10).stdout.strip() or None
    except Exception:
        m["git"] = None
    # scripts/stage_device.sh's record of the commit the staged binaries come from (on the GPU
    # machine "git" above is the copy's base, which may be older).
    build = os.path.join(REPO, ".carry", "BUILD")
    if os.path.exists(build):
        with open(build) as f:
            m["build"] = f.read().strip()
    return m


def main():
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(REPO, "bench", "results", "tmp"))
    ap.add_argument("--configs", default="seed,bf16_bs4,bf16_bs32,best",
                    help="comma list of: " + ", ".join(CONFIG_TITLES))
    ap.add_argument("--batches", type=ints, default=[16, 32, 48, 64], help="batch sizes for 'best', both sides")
    ap.add_argument("--hf-batches", type=ints, help="override --batches for the HF side")
    ap.add_argument("--anatomy-batches", type=ints, help="override --batches for the anatomy side")
    ap.add_argument("--only", choices=["all", "hf", "anatomy"], default="all")
    ap.add_argument("--quick", action="store_true", help="fewer samples/steps (smoke test)")
    ap.add_argument("--anatomy-bin", default=os.path.join(REPO, "build", "anatomy"))
    ap.add_argument("--anatomy-args", default="", help="extra flags appended to every anatomy command")
    ap.add_argument("--no-trainer-bs32", action="store_true", help="skip the HF Trainer run in bf16_bs32")
    ap.add_argument("--resume", nargs="+", metavar="JSONL",
                    help="side_by_side.jsonl files of earlier runs: their successful runs are reused, not rerun")
    ap.add_argument("--timeout", type=float, default=300, help="per-run timeout, seconds")
    ap.add_argument("--budget", type=float, default=570,
                    help="total seconds; later runs get what is left, or are skipped (0 = no limit)")
    a = ap.parse_args()
    a.configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    a.hf_batches = a.hf_batches or a.batches
    a.anatomy_batches = a.anatomy_batches or a.batches
    a.anatomy_bin = os.path.abspath(a.anatomy_bin)
    a.out = os.path.abspath(a.out)
    for c in a.configs:
        if c not in CONFIG_TITLES:
            ap.error(f"unknown config {c!r}")
    b = Bench(a)
    b.emit(meta(a))
    b.run()


if __name__ == "__main__":
    main()
