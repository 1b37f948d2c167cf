#!/usr/bin/env python3
"""Check that a model directory written by anatomy loads in Hugging Face transformers.

    python3 tests/golden/verify_hf_load.py DIR [--golden FILE] [--atol A] [--rtol R]

DIR holds config.json + model.safetensors (HF names). The script loads it with
AutoModelForSequenceClassification.from_pretrained(DIR, attn_implementation="eager", dtype=float32)
(the class of its config.json's model_type: BERT, RoBERTa, XLM-R, DistilBERT, ELECTRA),
fails on any missing / unexpected / mismatched key, and runs one batch in eval mode on the CPU:
  1. the inputs in DIR/logits_anatomy.json, if that file carries "input_ids"
     (optional "token_type_ids", "attention_mask"), else
  2. the golden inputs (default tests/data/golden/golden.safetensors) if they fit the config
     (ids < vocab_size, T <= max_position_embeddings, token types < type_vocab_size), else
  3. a random batch (B=2, T=min(16, max_position_embeddings), torch seed 0, no padding).
If DIR/logits_anatomy.json exists ({"logits": [[...]], ...}) its logits are compared with
HF's: ok iff |hf - anatomy| <= atol + rtol*|hf| everywhere.
Prints one JSON line; exit status 0 on success, 1 on any failure.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_GOLDEN = os.path.normpath(os.path.join(HERE, "..", "data", "golden", "golden.safetensors"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--golden", default=DEFAULT_GOLDEN)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--rtol", type=float, default=1e-3)
    args = ap.parse_args()

    result = {"loaded": False, "dir": args.dir}
    failures = []
    try:
        import torch
        from transformers import AutoModelForSequenceClassification, logging as hf_logging
        hf_logging.set_verbosity_error()

        model, info = AutoModelForSequenceClassification.from_pretrained(
            args.dir, attn_implementation="eager", dtype=torch.float32, output_loading_info=True)
        missing = sorted(info.get("missing_keys", []))
        unexpected = sorted(info.get("unexpected_keys", []))
        mismatched = [list(map(str, m)) if isinstance(m, (tuple, list)) else str(m)
                      for m in info.get("mismatched_keys", [])]
        errors = [str(e) for e in info.get("error_msgs", [])]
        result.update(loaded=True, missing=missing, unexpected=unexpected)
        if mismatched:
            result["mismatched"] = mismatched
        if errors:
            result["error_msgs"] = errors
        if missing or unexpected or mismatched or errors:
            failures.append("loading info not clean")

        cfg = model.config
        anatomy_path = os.path.join(args.dir, "logits_anatomy.json")
        anatomy = None
        if os.path.exists(anatomy_path):
            with open(anatomy_path) as f:
                anatomy = json.load(f)

        batch, source = None, None
        if anatomy is not None and "input_ids" in anatomy:
            ids = torch.tensor(anatomy["input_ids"], dtype=torch.long)
            batch = {"input_ids": ids}
            for k in ("token_type_ids", "attention_mask"):
                if k in anatomy:
                    batch[k] = torch.tensor(anatomy[k], dtype=torch.long)
            source = "logits_anatomy.json"
        elif os.path.exists(args.golden):
            from safetensors.torch import load_file
            g = load_file(args.golden)
            ids, tt = g["input_ids"], g["token_type_ids"]
            if (int(ids.max()) < cfg.vocab_size and ids.shape[1] <= cfg.max_position_embeddings
                    and int(tt.max()) < getattr(cfg, "type_vocab_size", 0)):
                batch = {k: g[k].long() for k in ("input_ids", "token_type_ids", "attention_mask")}
                source = "golden"
        if batch is None:
            gen = torch.Generator().manual_seed(0)
            T = min(16, cfg.max_position_embeddings)
            batch = {"input_ids": torch.randint(1, cfg.vocab_size, (2, T), generator=gen),
                     "attention_mask": torch.ones(2, T, dtype=torch.long)}
            source = "random"
        result["inputs"] = source

        if cfg.model_type == "distilbert":  # it has no token types
            batch.pop("token_type_ids", None)
        model.eval()
        with torch.no_grad():
            logits = model(**batch).logits.float()
        result["logits"] = logits.tolist()
        if not torch.isfinite(logits).all():
            failures.append("non-finite logits")

        if anatomy is not None:
            ref = torch.tensor(anatomy.get("logits", []), dtype=torch.float32)
            if ref.shape != logits.shape:
                failures.append(f"logits_anatomy shape {list(ref.shape)} != HF {list(logits.shape)}")
            else:
                diff = (logits - ref).abs()
                result["max_abs_diff"] = float(diff.max())
                ok = bool((diff <= args.atol + args.rtol * logits.abs()).all())
                result["logits_match"] = ok
                if not ok:
                    failures.append(f"logits differ: max abs diff {float(diff.max()):.3e}")
    except Exception as e:  # report, never a bare traceback only
        failures.append(f"{type(e).__name__}: {e}")

    result["ok"] = not failures
    if failures:
        result["failures"] = failures
    print(json.dumps(result), flush=True)
    if "max_abs_diff" in result:
        print(f"max abs diff vs anatomy logits: {result['max_abs_diff']:.3e}", file=sys.stderr)
    sys.exit(0 if not failures else 1)


if __name__ == "__main__":
    main()
