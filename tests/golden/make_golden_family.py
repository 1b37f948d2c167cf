#!/usr/bin/env python3
"""Write the golden fixtures of the encoder variants (RoBERTa, XLM-R, DistilBERT, ELECTRA) that
anchor anatomy's model to Hugging Face transformers, in the form of make_golden.py's BERT fixture.

    python3 tests/golden/make_golden_family.py [OUT_DIR]      (default: tests/data/golden_family)

Runs on the CPU in float32, deterministically (needs torch, transformers, safetensors). For each
architecture ARCH in roberta, xlm-roberta, distilbert, electra it writes OUT_DIR/ARCH/:

  config.json, model.safetensors   model.save_pretrained(): the initial weights under the names
                                   transformers writes; this script checks that from_pretrained
                                   reads them back with no missing or unexpected key.
  golden.safetensors               inputs, logits, loss, every gradient, 5 AdamW steps (KEYS_DOC).
  golden.json                      summary: config, losses, versions, the parameter names.

Sizes are tiny and odd: hidden 24 with 3 heads (head dim 8), intermediate 40, 2 layers, batch 3 of
length 11 with right padding (pad_token_id where the mask is 0, as a tokenizer pads). RoBERTa and
XLM-R batches hold a sentence pair (<s> A </s></s> B </s>); ELECTRA's has token types 0/1 for
its pair; DistilBERT has no token types. ELECTRA's embedding_size 16 differs from its hidden
size, so embeddings_project is exercised. Dropout is 0; LayerNorm gammas and every bias are
perturbed away from 1 and 0 so that they cannot hide bugs. AdamW follows the HF Trainer recipe of
make_golden.py (no decay for biases and LayerNorm parameters, clip 1.0, constant lr 1e-3).
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (DistilBertConfig, DistilBertForSequenceClassification, ElectraConfig,
                          ElectraForSequenceClassification, RobertaConfig, RobertaForSequenceClassification,
                          XLMRobertaConfig, XLMRobertaForSequenceClassification)

KEYS_DOC = {
    "input_ids": "I64 [B,T]",
    "token_type_ids": "I64 [B,T] (all 0 where the architecture has none)",
    "attention_mask": "I64 [B,T] (1 = token, 0 = padding)",
    "labels": "I64 [B]",
    "logits": "F32 [B,num_labels], train-mode forward (dropout probabilities are 0)",
    "loss": "F32 [1], CrossEntropyLoss mean over the batch",
    "grad.{name}": "F32, d loss / d parameter for every named parameter (HF name, same shape)",
    "adamw_losses": "F32 [5], loss before each of the 5 AdamW steps",
    "adamw_final_loss": "F32 [1], loss after the 5th step",
    "adamw_final.{name}": "F32, every parameter after the 5 AdamW steps",
}

B, T, V, C = 3, 11, 96, 3
STEPS = 5
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
MAX_GRAD_NORM = 1.0
COMMON = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0,
              initializer_range=0.2, hidden_size=24, num_attention_heads=3, num_hidden_layers=2,
              intermediate_size=40, vocab_size=V, num_labels=C)


def make_model(arch):
    if arch in ("roberta", "xlm-roberta"):
        cls_cfg, cls = ((RobertaConfig, RobertaForSequenceClassification) if arch == "roberta" else
                        (XLMRobertaConfig, XLMRobertaForSequenceClassification))
        cfg = cls_cfg(**COMMON, max_position_embeddings=T + 4, type_vocab_size=1, pad_token_id=1,
                      bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
    elif arch == "distilbert":
        cls = DistilBertForSequenceClassification
        cfg = DistilBertConfig(vocab_size=V, dim=24, n_heads=3, n_layers=2, hidden_dim=40,
                               max_position_embeddings=T + 2, dropout=0.0, attention_dropout=0.0,
                               seq_classif_dropout=0.0, initializer_range=0.2, pad_token_id=0, num_labels=C)
    elif arch == "electra":
        cls = ElectraForSequenceClassification
        cfg = ElectraConfig(**COMMON, embedding_size=16, max_position_embeddings=T + 2, type_vocab_size=2,
                            pad_token_id=0)
    else:
        raise ValueError(arch)
    cfg._attn_implementation = "eager"
    return cfg, cls(cfg).to(torch.float32)


def perturb(model, gen):
    """Random LayerNorm gammas/betas and biases (HF init sets them to exactly 1 and 0)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1.0 + 0.2 * torch.randn(module.weight.shape, generator=gen))
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))
            elif isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))


def make_batch(arch, cfg, gen):
    pad = cfg.pad_token_id
    lengths = [T, T - 4, T - 7]
    ids = torch.randint(3, V, (B, T), generator=gen, dtype=torch.long)
    types = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = pad
    if arch in ("roberta", "xlm-roberta"):  # <s> A </s></s> B </s> in sample 0, <s> A </s> elsewhere
        ids[:, 0] = cfg.bos_token_id
        for b, n in enumerate(lengths):
            ids[b, n - 1] = cfg.eos_token_id
        ids[0, 5] = ids[0, 6] = cfg.eos_token_id
    elif arch == "electra":  # [CLS] A [SEP] B [SEP] in sample 0 with types 0 then 1
        types[0, 6:] = 1
    batch = dict(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2, 1], dtype=torch.long))
    if arch != "distilbert":
        batch["token_type_ids"] = types
    return batch, types


def no_decay(name):
    """HF Trainer: every bias and the LayerNorm parameters (all variants' spellings)."""
    n = name.lower()
    return "bias" in n or "layernorm" in n or "layer_norm" in n


def adamw_run(model, init_state, batch, no_decay=no_decay):
    """STEPS AdamW steps from init_state as the Trainer takes them (no weight decay where
    no_decay(name)): the losses, the final loss and the final parameters."""
    model.load_state_dict(init_state)
    model.train()
    decay = [p for n, p in model.named_parameters() if not no_decay(n)]
    nodecay = [p for n, p in model.named_parameters() if no_decay(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": nodecay, "weight_decay": 0.0}], lr=ADAMW["lr"], betas=ADAMW["betas"],
                            eps=ADAMW["eps"], foreach=False, fused=False)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=MAX_GRAD_NORM)
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        final = model(**batch).loss.item()
    return losses, final, {n: p.detach().clone() for n, p in model.named_parameters()}


def f32(x):
    return torch.as_tensor(x, dtype=torch.float32).detach().clone().contiguous()


def write_arch(arch, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    cfg, model = make_model(arch)
    perturb(model, torch.Generator().manual_seed(1234))
    batch, types = make_batch(arch, cfg, torch.Generator().manual_seed(42))
    model.save_pretrained(out_dir)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    # What transformers wrote must load back with nothing missing or unexpected.
    _, info = type(model).from_pretrained(out_dir, output_loading_info=True, attn_implementation="eager")
    bad = {k: v for k, v in info.items() if v}
    assert not bad, (arch, bad)

    model.train()
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    tensors = {k: v.clone().contiguous() for k, v in batch.items() if k != "token_type_ids"}
    tensors["token_type_ids"] = types.clone().contiguous()
    tensors["logits"] = f32(out.logits.detach())
    tensors["loss"] = f32(out.loss.detach()).reshape(1)
    names = []
    for name, p in model.named_parameters():
        names.append(name)
        tensors["grad." + name] = f32(p.grad if p.grad is not None else torch.zeros_like(p))
    losses, final, params = adamw_run(model, init_state, batch)
    assert abs(losses[0] - out.loss.item()) < 1e-6
    tensors["adamw_losses"] = f32(losses)
    tensors["adamw_final_loss"] = f32([final])
    for name, p in params.items():
        tensors["adamw_final." + name] = f32(p)
    save_file(tensors, os.path.join(out_dir, "golden.safetensors"),
              metadata={"generator": "tests/golden/make_golden_family.py", "torch": torch.__version__,
                        "transformers": transformers.__version__})
    summary = {
        "generator": "tests/golden/make_golden_family.py",
        "architecture": type(model).__name__,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "config": json.loads(cfg.to_json_string(use_diff=False)),
        "batch": {"B": B, "T": T, "input_ids": batch["input_ids"].tolist(),
                  "attention_mask": batch["attention_mask"].tolist(), "token_type_ids": types.tolist(),
                  "labels": batch["labels"].tolist()},
        "loss": out.loss.item(),
        "logits": out.logits.detach().tolist(),
        "adamw": {"losses": losses, "final_loss": final},
        "parameters": names,
        "keys": KEYS_DOC,
    }
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    return {"arch": arch, "loss": out.loss.item(), "adamw_final_loss": final,
            "bytes": sum(os.path.getsize(os.path.join(out_dir, n)) for n in os.listdir(out_dir))}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                              "data", "golden_family")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    for arch in ("roberta", "xlm-roberta", "distilbert", "electra"):
        print(json.dumps(write_arch(arch, os.path.join(os.path.normpath(out), arch))))


if __name__ == "__main__":
    main()
