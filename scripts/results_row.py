#!/usr/bin/env python3
"""One markdown table row from a run's train_results.json, for the device scripts.

    python3 scripts/results_row.py levers|dist NAME PATH

levers: samples/s, planned / allocated MiB (shared bytes counted once), gradients in
activations, NVML, NVML minus baseline and context, optimizer and gradient bytes/param,
activations, last loss (scripts/device.sh levers). dist: ranks, ZeRO stage, samples/s, first and
last step loss, optimizer state per rank, NVML per GPU, the steady steps' median SM clock and
power (scripts/device.sh dist, distab, trainab: an A/B at the power limit is also one of clocks,
Note [clock and power]). A missing or unreadable file gives a row that says so."""
import json
import sys


def mib(b):
    return b / 2**20


def levers(name, r):
    p, a = r["planned_bytes"], r["allocator_peak_bytes"]
    ps, as_ = r.get("planned_shared_bytes", 0), r.get("allocator_shared_bytes", 0)
    n = r["num_parameters"]
    nvml = r["gpu_memory_occupied_mb"]
    beyond = nvml - r["cuda_context_mb"] - r.get("nvml_baseline_mb", 0)
    return (f"| {name} | {r['steady_samples_per_second']:.1f} | {mib(sum(p.values()) - ps):.0f} | "
            f"{mib(sum(a.values()) - as_):.0f} | {mib(as_):.0f} | {nvml} | {beyond} | "
            f"{a['optimizer_state'] / n:.2f} | {a['gradients'] / n:.2f} | {mib(a['activations']):.0f} | "
            f"{r['last_step_loss']:.3g} |")


def dist(name, r):
    per = r.get("gpu_memory_per_rank_mb") or [r["gpu_memory_occupied_mb"]]
    opt = r.get("rank_optimizer_state_bytes") or [r["allocator_peak_bytes"]["optimizer_state"]]
    return (f"| {name} | {r.get('world_size', 1)} | {r.get('zero_stage', 0)} | {r['steady_samples_per_second']:.1f} | "
            f"{r['first_step_loss']:.6f} | {r['last_step_loss']:.6f} | {' / '.join(f'{mib(b):.0f}' for b in opt)} | "
            f"{' / '.join(str(m) for m in per)} | {clock(r)} |")


def clock(r):
    mhz, watts = r.get("gpu_sm_clock_mhz_median"), r.get("gpu_power_w_median")
    return "n/a" if mhz is None else f"{mhz:.0f} MHz, {watts:.0f} W"


if __name__ == "__main__":
    kind, name, path = sys.argv[1:4]
    try:
        r = json.load(open(path))
        print({"levers": levers, "dist": dist}[kind](name, r))
    except Exception as e:  # the row says what went wrong; the table goes on
        print(f"| {name} | failed: {type(e).__name__}: {e} |")
