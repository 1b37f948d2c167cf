#!/usr/bin/env python3
"""Writes the synthetic run directories run_bs4/ and run_bs32/ that tests/unit/test_report.cpp
renders. They are test fixtures, NOT measurements: every number comes from the simple cost
model below (bert-large, seq 512, bf16 mixed precision, AdamW, on an H100-like device), chosen
to be plausible, so the page has realistic shapes to draw. Deterministic (fixed seed).

    python3 tests/data/report/make_fixtures.py
"""
import json
import math
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))

# bert-large-uncased + a 2-label classification head.
L, H, FF, HEADS, T, VOCAB = 24, 1024, 4096, 16, 512, 30522
P = 335_143_938
BF16, FP32 = 2, 4
MIB = 1 << 20

# The device's "measured" ceilings (an H100 SXM runs dense bf16 GEMMs near 780 TFLOP/s and
# copies near 2.95 TB/s in practice; the data sheet says 989 and 3350).
CEIL_TFLOPS, CEIL_GBPS = 780.0, 2950.0
LAUNCH_S = 4e-6  # per kernel call


def op_time(cls, flops, nbytes, calls, gemm_eff):
    """Seconds for all calls of one op: the slower of compute and memory, plus launches."""
    if cls == "tensor_contraction":
        t = max(flops / (CEIL_TFLOPS * 1e12 * gemm_eff), nbytes / (CEIL_GBPS * 1e9 * 0.85))
    elif cls == "data":
        t = nbytes / 25e9  # pinned host-to-device copy
    else:
        t = max(flops / (CEIL_TFLOPS * 1e12 * 0.05), nbytes / (CEIL_GBPS * 1e9 * 0.78))
    return t + calls * LAUNCH_S


def make_ops(B):
    N = B * T  # tokens
    gemm_eff = 0.56 if B <= 4 else 0.76
    ops = []

    def add(name, cls, phase, calls, flops, nbytes):
        t = op_time(cls, flops, nbytes, calls, gemm_eff)
        ops.append({"name": name, "class": cls, "phase": phase, "calls": calls,
                    "time_ms": round(t * 1e3, 4), "flops": float(flops), "bytes": float(nbytes)})

    def gemm(m, n, k):  # flops, bytes of C(m,n) = A(m,k) B(k,n) in bf16
        return 2.0 * m * n * k, BF16 * (m * k + k * n + m * n)

    add("data.h2d_batch", "data", "data", 4, 0.0, 3 * N * 4 + B * 4)
    add("embeddings.lookup", "elementwise", "forward", 1, 3 * N * H, 4 * N * H * BF16)
    add("embeddings.layernorm", "statistical_normalization", "forward", 1, 8 * N * H, 2 * N * H * BF16)
    f, b = gemm(N, 3 * H, H)
    add("attention.qkv_gemm", "tensor_contraction", "forward", L, L * f, L * b)
    add("attention.flash", "tensor_contraction", "forward", L, L * 4.0 * B * T * T * H,
        L * (4 * N * H * BF16 + B * HEADS * T * FP32))
    f, b = gemm(N, H, H)
    add("attention.out_gemm", "tensor_contraction", "forward", L, L * f, L * b)
    add("attention.bias_dropout_residual", "elementwise", "forward", L, L * 4 * N * H, L * N * H * 7)
    add("attention.layernorm", "statistical_normalization", "forward", L, L * 8 * N * H, L * (2 * N * H * BF16 + N * 8))
    f, b = gemm(N, FF, H)
    add("ffn.in_gemm", "tensor_contraction", "forward", L, L * f, L * b)
    add("ffn.bias_gelu", "elementwise", "forward", L, L * 9 * N * FF, L * 2 * N * FF * BF16)
    f, b = gemm(N, H, FF)
    add("ffn.out_gemm", "tensor_contraction", "forward", L, L * f, L * b)
    add("ffn.bias_dropout_residual", "elementwise", "forward", L, L * 4 * N * H, L * N * H * 7)
    add("ffn.layernorm", "statistical_normalization", "forward", L, L * 8 * N * H, L * (2 * N * H * BF16 + N * 8))
    f, b = gemm(B, H, H)
    add("head.pooler_gemm", "tensor_contraction", "forward", 1, f, b)
    add("head.pooler_tanh", "elementwise", "forward", 1, 6 * B * H, 2 * B * H * BF16)
    f, b = gemm(B, 2, H)
    add("head.classifier_gemm", "tensor_contraction", "forward", 1, f, b)
    add("loss.cross_entropy", "statistical_normalization", "forward", 1, 8 * B * 2, B * 2 * FP32 * 2)

    # Backward: each GEMM becomes dgrad + wgrad (2x the flops), flash attention recomputes
    # the scores (2.5x), element-wise and normalization ops read and write about twice as much.
    add("loss.cross_entropy_backward", "statistical_normalization", "backward", 1, 4 * B * 2, B * 2 * FP32 * 2)
    add("head.backward", "tensor_contraction", "backward", 4, 4.0 * B * H * H, 3 * BF16 * (B * H + H * H))
    fwd = [o for o in ops if o["phase"] == "forward" and o["name"].split(".")[0] in ("attention", "ffn")]
    for o in reversed(fwd):
        scale_f = {"tensor_contraction": 2.0, "statistical_normalization": 1.6, "elementwise": 1.2}[o["class"]]
        if o["name"] == "attention.flash":
            scale_f = 2.5
        scale_b = 2.0 if o["class"] == "tensor_contraction" else 1.6
        add(o["name"] + "_backward", o["class"], "backward", o["calls"] * (2 if o["class"] == "tensor_contraction" else 1),
            o["flops"] * scale_f, o["bytes"] * scale_b)
    add("embeddings.layernorm_backward", "statistical_normalization", "backward", 1, 12 * N * H, 3 * N * H * BF16)
    add("embeddings.scatter_add", "elementwise", "backward", 3, N * H, N * H * (BF16 + 2 * FP32))

    add("optimizer.grad_norm", "optimizer", "optimizer", 2, 2.0 * P, 4.0 * P)
    add("optimizer.adamw_update", "optimizer", "optimizer", 1, 12.0 * P, 30.0 * P)
    add("optimizer.zero_grads", "optimizer", "optimizer", 1, 0.0, 4.0 * P)
    return ops


def make_profile(B):
    ops = make_ops(B)
    phase_ms = {p: sum(o["time_ms"] for o in ops if o["phase"] == p) for p in ("forward", "backward", "optimizer", "data")}
    ops_ms = sum(phase_ms.values())
    step_ms = ops_ms * 1.025  # gaps between kernels the per-op timers do not see
    tot_f = sum(o["flops"] for o in ops)
    tot_t = sum(o["time_ms"] for o in ops)
    classes = []
    for c in ("tensor_contraction", "statistical_normalization", "elementwise", "optimizer", "data"):
        sel = [o for o in ops if o["class"] == c]
        f = sum(o["flops"] for o in sel)
        by = sum(o["bytes"] for o in sel)
        t = sum(o["time_ms"] for o in sel)
        classes.append({"class": c, "flops_pct": round(100 * f / tot_f, 4), "time_pct": round(100 * t / tot_t, 3),
                        "tflops": round(f / (t * 1e-3) / 1e12, 3), "gbps": round(by / (t * 1e-3) / 1e9, 2)})
    return {"steps_profiled": 3, "step_time_ms": round(step_ms, 3), "ops_time_ms": round(ops_ms, 3),
            "forward_ms": round(phase_ms["forward"], 3), "backward_ms": round(phase_ms["backward"], 3),
            "optimizer_ms": round(phase_ms["optimizer"], 3), "data_ms": round(phase_ms["data"], 3),
            "ceilings": {"tflops": CEIL_TFLOPS, "gbps": CEIL_GBPS},
            "ops": ops, "classes": classes}


def act_bytes_per_layer(B):
    # Tensors saved for backward per layer (flash attention, so no T x T scores), bf16 unless
    # noted: layer input, QKV, context, logsumexp (fp32), two dropout masks (1 byte), two
    # LayerNorm inputs with fp32 mean and rstd, FFN input, pre-GELU and GELU outputs.
    N = B * T
    return (N * H * BF16 + 3 * N * H * BF16 + N * H * BF16 + B * HEADS * T * FP32 + 2 * N * H
            + 2 * (N * H * BF16 + N * 8) + N * H * BF16 + 2 * N * FF * BF16)


def categories(B):
    N = B * T
    emb_act = 2 * N * H * BF16 + N * H
    head_act = B * H * BF16 * 2 + B * 2 * FP32
    return {
        "weights": 6 * P,
        "optimizer_state": 8 * P,
        "gradients": 4 * P,
        "activations": L * act_bytes_per_layer(B) + emb_act + head_act,
        "temporary": 2 * N * FF * BF16 + 4 * MIB,
        "workspace": 32 * MIB,
        "other": 3 * N * 4 + B * 4 + 4,
    }


def timeline(B):
    c = categories(B)
    live = {k: 0 for k in c}
    for k in ("weights", "optimizer_state", "gradients", "workspace", "other"):
        live[k] = c[k]
    N = B * T
    events = []

    def ev(label, phase, temp=0):
        b = dict(live)
        b["temporary"] = temp
        events.append({"label": label, "phase": phase, "bytes": b})

    per_layer = act_bytes_per_layer(B)
    attn_part = per_layer - (N * H * BF16 + 2 * N * FF * BF16 + N * H + N * H * BF16 + N * 8)
    ev("step start", "forward")
    live["activations"] += 2 * N * H * BF16 + N * H
    ev("embeddings", "forward", N * H * FP32)
    for i in range(L):
        live["activations"] += attn_part
        ev(f"layer.{i}.attention", "forward", N * H * BF16)
        live["activations"] += per_layer - attn_part
        ev(f"layer.{i}.ffn", "forward", N * FF * BF16)
    live["activations"] += B * H * BF16 * 2 + B * 2 * FP32
    ev("head + loss", "forward", B * 2 * FP32)
    ev("loss backward", "backward", B * H * FP32)
    for i in reversed(range(L)):
        live["activations"] -= per_layer - attn_part
        ev(f"layer.{i}.ffn.backward", "backward", c["temporary"])
        live["activations"] -= attn_part
        ev(f"layer.{i}.attention.backward", "backward", 3 * N * H * BF16 + 4 * MIB)
    live["activations"] = 0
    ev("embeddings.backward", "backward", N * H * FP32)
    ev("optimizer.grad_norm", "optimizer", 4 * MIB)
    ev("optimizer.adamw_update", "optimizer", 0)
    return {"events": events}


def run(B, num_samples, logging_steps, rng):
    prof = make_profile(B)
    cats = categories(B)
    planned = dict(cats)
    planned["temporary"] = cats["temporary"] + 8 * MIB  # the planner's bound is a little loose
    steps = num_samples // B
    step_s = prof["step_time_ms"] * 1e-3
    startup_s = 1.9
    context_mb, weights_mb = 486, cats["weights"] // MIB
    occupied_mb = context_mb + sum(cats.values()) // MIB + (64 if B <= 4 else 160)  # caching slack
    metrics = []
    loss = 0.71
    data_wait = 0.0
    for s in range(1, steps + 1):
        loss = loss * (0.93 if B <= 4 else 0.80) + 0.002
        data_wait += rng.uniform(0, 2e-5)
        if s % logging_steps == 0 or s == steps:
            now = s * step_s * (1 + rng.uniform(-0.01, 0.01)) + (0.35 if B <= 4 else 0.6)  # first step warms up
            metrics.append({"step": s, "loss": round(loss * (1 + rng.uniform(-0.05, 0.05)), 6),
                            "learning_rate": 5e-5 * (1 - s / steps), "samples_per_second": round(s * B / now, 3),
                            "elapsed_s": round(now, 4), "data_wait_s": round(data_wait, 6), "loss_scale": 1.0,
                            "gpu_memory_used_mb": occupied_mb - rng.choice([0, 0, 2])})
    runtime = metrics[-1]["elapsed_s"]
    nvml = []
    t = 0.0
    total = startup_s + runtime + 0.5
    while t <= total:
        if t < 0.4:
            mem, util, mutil = 0, 0, 0
        elif t < 0.9:
            mem, util, mutil = context_mb, 0, 0
        elif t < startup_s:
            frac = (t - 0.9) / (startup_s - 0.9)
            mem = context_mb + int(frac * (cats["weights"] + cats["optimizer_state"] + cats["gradients"]) / MIB)
            util, mutil = int(10 * frac), int(8 * frac)
        elif t < startup_s + runtime:
            mem = occupied_mb
            util = min(100, int((86 if B <= 4 else 97) + rng.uniform(-3, 3)))
            mutil = int((48 if B <= 4 else 41) + rng.uniform(-4, 4))
        else:
            mem, util, mutil = occupied_mb, 2, 1
        nvml.append({"t_s": round(t, 3), "gpu_memory_used_mb": mem, "gpu_util_pct": util, "mem_util_pct": mutil})
        t += 0.25
    sps = num_samples / runtime
    results = {
        "train_runtime": round(runtime, 4), "train_samples_per_second": round(sps, 3),
        "train_steps_per_second": round(steps / runtime, 3), "steady_samples_per_second": round(B / step_s, 3),
        "train_loss": round(sum(m["loss"] for m in metrics) / len(metrics), 6),
        "first_step_loss": 0.71, "last_step_loss": metrics[-1]["loss"], "steps": steps, "samples": num_samples,
        "skipped_steps": 0, "device": "cuda:0 (NVIDIA H100 80GB HBM3, sm_90, 81079 MiB)", "precision": "bf16",
        "per_device_train_batch_size": B, "gradient_accumulation_steps": 1, "gradient_checkpointing": "none",
        "optim": "adamw", "seq_len": T, "num_parameters": P, "data_wait_s": round(data_wait, 6),
        "gpu_memory_occupied_mb": occupied_mb, "cuda_context_mb": context_mb, "weights_mb": weights_mb,
        "process_peak_rss_mb": 1412, "allocator_peak_bytes": cats, "planned_bytes": planned,
    }
    return results, metrics, nvml, prof, timeline(B)


def write_run(name, B, num_samples, logging_steps, seed):
    rng = random.Random(seed)
    results, metrics, nvml, prof, tl = run(B, num_samples, logging_steps, rng)
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "train_results.json"), "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(m) + "\n" for m in metrics)
    with open(os.path.join(d, "nvml.jsonl"), "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in nvml)
    with open(os.path.join(d, "profile.json"), "w") as f:
        json.dump(prof, f, indent=1)
        f.write("\n")
    with open(os.path.join(d, "memory_timeline.json"), "w") as f:
        json.dump(tl, f, separators=(",", ":"))
        f.write("\n")
    print(f"{name}: {results['steady_samples_per_second']:.1f} samples/s steady, step {prof['step_time_ms']:.1f} ms, "
          f"fwd {prof['forward_ms']:.1f} bwd {prof['backward_ms']:.1f} opt {prof['optimizer_ms']:.1f}, "
          f"{results['gpu_memory_occupied_mb']} MiB; classes " +
          ", ".join(f"{c['class'][:6]} {c['flops_pct']:.3f}%f {c['time_pct']:.1f}%t" for c in prof["classes"]))


if __name__ == "__main__":
    write_run("run_bs4", 4, 2048, 16, seed=4)
    write_run("run_bs32", 32, 2048, 2, seed=32)
