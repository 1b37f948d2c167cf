#!/usr/bin/env python3
"""Write the golden fixtures of ModernBERT (ModernBertForSequenceClassification) that anchor
anatomy's ModernBERT variant to Hugging Face transformers, in the form of make_golden_family.py's.

    /work/main/.venv/bin/python tests/golden/make_golden_modernbert.py [OUT_DIR [CASE ...]]
        (default: tests/data/golden_family, every case; CASE names a directory below: only those
        are written, so adding a case leaves the others' files as they were)

Runs on the CPU in float32 with the eager attention (needs torch, transformers, safetensors).
Sizes are tiny and odd: hidden 24 with 3 heads (head dim 8: rotary embeddings pair columns, so
the head dim must be even), intermediate 21 (Wi has 42 rows), 3 layers with
global_attn_every_n_layers 2 (layers 0 and 2 global, layer 1 local), local_attention 4 (each
token sees keys within +-2, fewer than the sequence of 11), batch 3 with right padding.
Layer 0 has no attn_norm (transformers' Identity). Two variants:

  modernbert             the default config: no biases anywhere (attention_bias, mlp_bias,
                         norm_bias, classifier_bias false), classifier_pooling "cls".
  modernbert-bias-mean   every bias on, classifier_pooling "mean" over the attention mask.
  modernbert-ner         ModernBertForTokenClassification, every bias on, 5 labels: labels I64
                         [B, T], -100 on the special tokens, the padding and about a third of the
                         other tokens; logits F32 [B, T, 5]; the loss is the mean over the
                         labelled tokens.
  modernbert-mlm         ModernBertForMaskedLM, every bias on: the decoder tied to
                         tok_embeddings (not in the file) with its bias (decoder.bias); labels
                         I64 [B, T], a random token id on about a third of the tokens between the
                         special ones, -100 elsewhere; logits F32 [B, T, V]; the embeddings'
                         gradient includes the tied decoder's.
  modernbert-regression  ModernBertForSequenceClassification, no biases, classifier_pooling "cls",
                         num_labels 1, problem_type unset (so transformers infers regression):
                         labels F32 [B, 1] as make_golden_tasks.py writes them; MSE over B.
  modernbert-multilabel  ModernBertForSequenceClassification, every bias on, classifier_pooling
                         "mean", num_labels 4, problem_type multi_label_classification: labels
                         F32 [B, 4] multi-hot (make_golden_tasks.py's); BCEWithLogitsLoss.

Dropout is 0; LayerNorm gammas and every bias are perturbed away from 1 and 0. AdamW as in
make_golden_family.py, except that the no-decay set is the HF Trainer's for this model: every
bias and every LayerNorm parameter (ModernBERT names them *norm*).
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (ModernBertConfig, ModernBertForMaskedLM, ModernBertForSequenceClassification,
                          ModernBertForTokenClassification)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden_family as fam  # noqa: E402  (its AdamW run, its tensor conversion)
import make_golden_tasks as tasks  # noqa: E402  (its float labels)

B, T, V, C = 3, 11, 96, 3
PAD, CLS, SEP = 0, 1, 2


def make_model(biases, pooling, cls=ModernBertForSequenceClassification, num_labels=C, problem_type=None):
    cfg = ModernBertConfig(vocab_size=V, hidden_size=24, intermediate_size=21, num_hidden_layers=3,
                           num_attention_heads=3, global_attn_every_n_layers=2, local_attention=4,
                           global_rope_theta=160000.0, local_rope_theta=10000.0, max_position_embeddings=64,
                           initializer_range=0.2, norm_eps=1e-5, pad_token_id=PAD, cls_token_id=CLS,
                           bos_token_id=CLS, sep_token_id=SEP, eos_token_id=SEP, attention_bias=biases,
                           mlp_bias=biases, norm_bias=biases, classifier_bias=biases, classifier_pooling=pooling,
                           embedding_dropout=0.0, attention_dropout=0.0, mlp_dropout=0.0, classifier_dropout=0.0,
                           num_labels=num_labels)
    cfg.problem_type = problem_type
    cfg._attn_implementation = "eager"
    return cfg, cls(cfg).to(torch.float32)


def perturb(model, gen):
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1.0 + 0.2 * torch.randn(module.weight.shape, generator=gen))
                if module.bias is not None:
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))
            elif isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))


def token_labels(mask, num_labels, gen):
    """Labels on the tokens between the special ones, about two in three of them; -100 elsewhere."""
    labels = torch.full((B, T), -100, dtype=torch.long)
    for b in range(B):
        n = int(mask[b].sum())
        for t in range(1, n - 1):
            if torch.rand(1, generator=gen).item() < 0.7:
                labels[b, t] = int(torch.randint(0, num_labels, (1,), generator=gen))
        labels[b, 1] = 1  # at least one labelled token per sequence
    return labels


def masked_labels(ids, mask, gen):
    """A random token id on about a third of the tokens between the special ones; -100 elsewhere."""
    labels = torch.full((B, T), -100, dtype=torch.long)
    for b in range(B):
        n = int(mask[b].sum())
        for t in range(1, n - 1):
            if torch.rand(1, generator=gen).item() < 0.3:
                labels[b, t] = int(torch.randint(3, V, (1,), generator=gen))
        labels[b, 1] = int(ids[b, 1])  # at least one scored token per sequence
    return labels


def make_batch(gen):
    lengths = [T, T - 4, T - 7]
    ids = torch.randint(3, V, (B, T), generator=gen, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, 0] = CLS
        ids[b, n - 1] = SEP
        ids[b, n:] = PAD
    return dict(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2, 1], dtype=torch.long))


def no_decay(name):
    return "bias" in name or "norm" in name


def write(name, biases, pooling, out_dir, cls=ModernBertForSequenceClassification, num_labels=C, problem_type=None,
          float_labels=False):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    cfg, model = make_model(biases, pooling, cls, num_labels, problem_type)
    assert isinstance(model.model.layers[0].attn_norm, torch.nn.Identity)
    assert model.config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    perturb(model, torch.Generator().manual_seed(1234))
    batch = make_batch(torch.Generator().manual_seed(42))
    if cls is ModernBertForTokenClassification:
        batch["labels"] = token_labels(batch["attention_mask"], num_labels, torch.Generator().manual_seed(11))
    if cls is ModernBertForMaskedLM:
        assert model.decoder.weight is model.model.embeddings.tok_embeddings.weight
        batch["labels"] = masked_labels(batch["input_ids"], batch["attention_mask"], torch.Generator().manual_seed(7))
    labels = None
    if float_labels:  # F32 [B, num_labels]; transformers squeezes both sides for num_labels 1
        labels = tasks.labels_for(problem_type, num_labels, torch.Generator().manual_seed(7), B)
        batch["labels"] = labels.squeeze(-1) if num_labels == 1 else labels
    model.save_pretrained(out_dir)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _, info = type(model).from_pretrained(out_dir, output_loading_info=True, attn_implementation="eager")
    bad = {k: v for k, v in info.items() if v}
    assert not bad, (name, bad)

    model.train()
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    if float_labels:
        assert model.config.problem_type == (problem_type or "regression"), model.config.problem_type
    tensors = {k: v.clone().contiguous() for k, v in batch.items()}
    if float_labels:
        tensors["labels"] = fam.f32(labels)
    tensors["token_type_ids"] = torch.zeros(B, T, dtype=torch.long)
    tensors["logits"] = fam.f32(out.logits.detach())
    tensors["loss"] = fam.f32(out.loss.detach()).reshape(1)
    names = []
    for pname, p in model.named_parameters():
        names.append(pname)
        tensors["grad." + pname] = fam.f32(p.grad if p.grad is not None else torch.zeros_like(p))
    losses, final, params = fam.adamw_run(model, init_state, batch, no_decay=no_decay)
    assert abs(losses[0] - out.loss.item()) < 1e-6
    tensors["adamw_losses"] = fam.f32(losses)
    tensors["adamw_final_loss"] = fam.f32([final])
    for pname, p in params.items():
        tensors["adamw_final." + pname] = fam.f32(p)
    meta = {"generator": "tests/golden/make_golden_modernbert.py", "torch": torch.__version__,
            "transformers": transformers.__version__}
    save_file(tensors, os.path.join(out_dir, "golden.safetensors"), metadata=meta)
    summary = {
        "generator": meta["generator"], "architecture": type(model).__name__,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "config": json.loads(cfg.to_json_string(use_diff=False)),
        "batch": {"B": B, "T": T, "input_ids": batch["input_ids"].tolist(),
                  "attention_mask": batch["attention_mask"].tolist(),
                  "labels": (labels if float_labels else batch["labels"]).tolist()},
        "loss": out.loss.item(),
        "logits": out.logits.detach().tolist() if cls is not ModernBertForMaskedLM else "golden.safetensors",
        "adamw": {"losses": losses, "final_loss": final}, "parameters": names,
    }
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    return {"fixture": name, "loss": out.loss.item(), "adamw_final_loss": final, "parameters": len(names)}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                              "data", "golden_family")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    only = set(sys.argv[2:])
    cases = (("modernbert", False, "cls", ModernBertForSequenceClassification, C),
             ("modernbert-bias-mean", True, "mean", ModernBertForSequenceClassification, C),
             ("modernbert-ner", True, "mean", ModernBertForTokenClassification, 5),
             ("modernbert-mlm", True, "cls", ModernBertForMaskedLM, C))
    float_cases = (("modernbert-regression", False, "cls", 1, None),
                   ("modernbert-multilabel", True, "mean", 4, "multi_label_classification"))
    unknown = only - {c[0] for c in cases + float_cases}
    assert not unknown, ("unknown cases", unknown)
    for name, biases, pooling, cls, labels in cases:
        if not only or name in only:
            print(json.dumps(write(name, biases, pooling, os.path.join(os.path.normpath(out), name), cls, labels)))
    for name, biases, pooling, labels, problem_type in float_cases:
        if not only or name in only:
            print(json.dumps(write(name, biases, pooling, os.path.join(os.path.normpath(out), name),
                                   ModernBertForSequenceClassification, labels, problem_type, float_labels=True)))


if __name__ == "__main__":
    main()
