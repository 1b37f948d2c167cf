#!/usr/bin/env python3
"""`anatomy eval` against transformers end to end: the model directory's own tokenizer.json and
weights, the texts of a JSONL file, anatomy's predictions.jsonl probabilities against
AutoModelForSequenceClassification on the ids of the `tokenizers` package.

    python3 tests/golden/family_eval_parity.py MODEL_DIR DATA.jsonl PREDICTIONS.jsonl [--pair COLUMN]
        [--max-length N]     (anatomy eval's --max-seq-length: the same truncation)

Compares log-probability differences (log p_i - log p_0, the logits up to a constant), so that
nearly uniform probabilities of a fresh model still test something. Prints one JSON line; exit 1
when the largest difference exceeds 1e-4.
"""
import argparse
import json
import sys

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForSequenceClassification


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("predictions")
    ap.add_argument("--pair", default=None)
    ap.add_argument("--max-length", type=int, default=128)
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.model + "/tokenizer.json")
    tok.enable_truncation(a.max_length)
    model = AutoModelForSequenceClassification.from_pretrained(a.model, attn_implementation="eager",
                                                               dtype=torch.float32).eval()
    rows = [json.loads(line) for line in open(a.data)]
    preds = [json.loads(line) for line in open(a.predictions)]
    assert len(rows) == len(preds), (len(rows), len(preds))
    worst = 0.0
    for row, pred in zip(rows, preds):
        enc = tok.encode(row["text"], row[a.pair]) if a.pair else tok.encode(row["text"])
        batch = {"input_ids": torch.tensor([enc.ids]), "attention_mask": torch.tensor([enc.attention_mask])}
        if model.config.model_type != "distilbert":
            batch["token_type_ids"] = torch.tensor([enc.type_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(**batch).logits[0].double(), -1)
        ours = torch.log(torch.tensor(pred["probabilities"], dtype=torch.float64))
        worst = max(worst, float(((logp - logp[0]) - (ours - ours[0])).abs().max()))
    print(json.dumps({"model": a.model, "samples": len(rows), "max_logit_difference": worst, "ok": worst <= 1e-4}))
    sys.exit(0 if worst <= 1e-4 else 1)


if __name__ == "__main__":
    main()
