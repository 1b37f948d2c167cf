#!/usr/bin/env python3
"""PyTorch's own bf16 error on each golden fixture: the yardstick for anatomy's bf16 GPU tests.

For every fixture directory under tests/data (golden, golden_family/*, golden_tasks/*,
golden_mlm/*), transformers builds the model from its config.json and model.safetensors, runs the
fixture's batch forward and backward under torch.autocast(bfloat16) on the GPU (fp32 weights, the
usual mixed precision), and compares with the fixture's fp32 values exactly as the GPU tests do
(tests/common/golden.h): the logits' relative error ||a - b|| / ||b||, the loss's relative error,
and the smallest cosine between a parameter's gradient and the fixture's over the parameters whose
gradient is not negligible (||g|| >= 1e-5 of the whole gradient's norm).

    python3 tests/golden/bf16_yardstick.py [--device cuda] > bf16_yardstick.md
"""
import argparse
import glob
import json
import math
import os
import sys

import torch
import transformers
from safetensors.torch import load_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def fixture_dirs():
    dirs = [os.path.join(ROOT, "golden")]
    for group in ("golden_family", "golden_tasks", "golden_mlm"):
        dirs += sorted(d for d in glob.glob(os.path.join(ROOT, group, "*")) if os.path.isdir(d))
    return dirs


def rel_err(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return math.sqrt(float(((a - b) ** 2).sum()) / max(float((b * b).sum()), 1e-30))


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a * b).sum()) / math.sqrt(max(float((a * a).sum()) * float((b * b).sum()), 1e-60))


def measure(d, device):
    cfg = json.load(open(os.path.join(d, "config.json")))
    cls = getattr(transformers, cfg["architectures"][0])
    model = cls.from_pretrained(d, attn_implementation="eager").to(device)
    model.train()
    g = load_file(os.path.join(d, "golden.safetensors"))
    batch = {"input_ids": g["input_ids"], "attention_mask": g["attention_mask"], "labels": g["labels"]}
    if "token_type_ids" in g and cfg.get("model_type") != "distilbert":
        batch["token_type_ids"] = g["token_type_ids"]
    batch = {k: v.to(device) for k, v in batch.items()}
    model.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        out = model(**batch)
    out.loss.float().backward()
    named = [(n, p) for n, p in model.named_parameters() if "grad." + n in g]
    total = math.sqrt(sum(float((g["grad." + n].double() ** 2).sum()) for n, _ in named))
    worst, worst_name = 1.0, ""
    for n, p in named:
        ref = g["grad." + n]
        if math.sqrt(float((ref.double() ** 2).sum())) < 1e-5 * total:
            continue
        got = p.grad.detach().float().cpu() if p.grad is not None else torch.zeros_like(ref)
        c = cosine(got, ref)
        if c < worst:
            worst, worst_name = c, n
    return {
        "fixture": os.path.relpath(d, ROOT),
        "logits_rel_err": rel_err(out.logits.detach().float().cpu(), g["logits"]),
        "loss_rel_err": abs(out.loss.item() - g["loss"].item()) / abs(g["loss"].item()),
        "min_grad_cosine": worst,
        "worst_parameter": worst_name,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}; autocast bfloat16\n")
    print("| fixture | logits rel. error | loss rel. error | min gradient cosine | at |")
    print("|---|---:|---:|---:|---|")
    for d in fixture_dirs():
        r = measure(d, args.device)
        print(f"| {r['fixture']} | {r['logits_rel_err']:.4f} | {r['loss_rel_err']:.4f} | "
              f"{r['min_grad_cosine']:.5f} | {r['worst_parameter']} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
