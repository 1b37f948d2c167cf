#!/usr/bin/env python3
"""Write the golden fixtures of the per-token heads: masked-LM (Bert/Roberta/XLMRoberta/DistilBertForMaskedLM)
and token classification (Bert/Roberta/XLMRoberta/DistilBert/ElectraForTokenClassification), in
the form of make_golden_family.py's.

    /work/main/.venv/bin/python tests/golden/make_golden_mlm.py [OUT_DIR [CASE ...]]
                                                    (default: tests/data/golden_mlm, every case)

CASE names a directory (bert-mlm, xlm-roberta-ner, ...): only those are written, so adding a
case leaves the others' files as they were.

Token classification cases (OUT_DIR/{bert,roberta,xlm-roberta,distilbert,electra}-ner/) have 5 labels and labels
-100 on the special tokens, padding and about a third of the other tokens (the later
sub-tokens of a word); logits F32 [B, T, 5]; the rest as below.

OUT_DIR/{bert,roberta,xlm-roberta,distilbert}-mlm/ hold config.json and model.safetensors as save_pretrained()
writes them (the decoder tied to the word embeddings, so not in the file; from_pretrained
must report nothing missing or unexpected) and golden.safetensors: input_ids, token_type_ids,
attention_mask, labels I64 [B, T] (-100 where a token is not scored; never a padding token),
logits F32 [B, T, V], loss (the mean over the scored tokens), grad.{name} for every parameter
(the word embeddings' gradient includes the tied decoder's), adamw_losses [5] and
adamw_final_loss. Sizes, padding, perturbation (the head's LayerNorm and bias too) and the AdamW
recipe are make_golden_family.py's.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (BertConfig, BertForMaskedLM, BertForTokenClassification, DistilBertConfig,
                          DistilBertForMaskedLM, DistilBertForTokenClassification,
                          ElectraForTokenClassification, RobertaConfig, RobertaForMaskedLM,
                          RobertaForTokenClassification, XLMRobertaConfig, XLMRobertaForMaskedLM,
                          XLMRobertaForTokenClassification)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden_family as fam  # noqa: E402

COMMON = {k: v for k, v in fam.COMMON.items() if k != "num_labels"}


def make_model(arch):
    if arch == "bert":
        cfg = BertConfig(**COMMON, max_position_embeddings=fam.T + 2, type_vocab_size=2, pad_token_id=0)
        cls = BertForMaskedLM
    elif arch == "distilbert":  # make_golden_family.py's DistilBERT sizes
        cfg = DistilBertConfig(vocab_size=fam.V, dim=24, n_heads=3, n_layers=2, hidden_dim=40,
                               max_position_embeddings=fam.T + 2, dropout=0.0, attention_dropout=0.0,
                               initializer_range=0.2, pad_token_id=0)
        cls = DistilBertForMaskedLM
    else:
        cfg_cls, cls = ((RobertaConfig, RobertaForMaskedLM) if arch == "roberta" else
                        (XLMRobertaConfig, XLMRobertaForMaskedLM))
        cfg = cfg_cls(**COMMON, max_position_embeddings=fam.T + 4, type_vocab_size=1, pad_token_id=1,
                      bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
    cfg._attn_implementation = "eager"
    return cfg, cls(cfg).to(torch.float32)


def perturb_head(model, gen):
    """The head's bias (a Parameter, not a Linear's) away from 0 too."""
    with torch.no_grad():
        if hasattr(model, "vocab_projector"):  # DistilBERT: the projector's bias
            bias = model.vocab_projector.bias
        else:
            bias = (model.cls.predictions if hasattr(model, "cls") else model.lm_head).bias
        bias.copy_(0.1 * torch.randn(bias.shape, generator=gen))


def write_case(arch, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    cfg, model = make_model(arch)
    fam.perturb(model, torch.Generator().manual_seed(1234))
    perturb_head(model, torch.Generator().manual_seed(99))
    batch, types = fam.make_batch("electra" if arch == "bert" else arch, cfg, torch.Generator().manual_seed(42))
    gen = torch.Generator().manual_seed(7)
    labels = torch.full((fam.B, fam.T), -100, dtype=torch.long)
    for b in range(fam.B):
        n = int(batch["attention_mask"][b].sum())
        for t in range(1, n - 1):
            if torch.rand(1, generator=gen).item() < 0.3:
                labels[b, t] = int(torch.randint(3, fam.V, (1,), generator=gen))
        labels[b, 1] = int(batch["input_ids"][b, 1])  # at least one scored token per sequence
    batch["labels"] = labels
    model.save_pretrained(out_dir)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _, info = type(model).from_pretrained(out_dir, output_loading_info=True, attn_implementation="eager")
    assert not {k: v for k, v in info.items() if v}, (arch, info)

    model.train()
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    tensors = {k: v.clone().contiguous() for k, v in batch.items() if k != "token_type_ids"}
    tensors["token_type_ids"] = types.clone().contiguous()
    tensors["logits"] = fam.f32(out.logits.detach())
    tensors["loss"] = fam.f32(out.loss.detach()).reshape(1)
    names = []
    # The tied decoder shares the word embeddings' tensor; some classes list it under the decoder's
    # name (XLMRobertaForMaskedLM), but the file and anatomy name it after the embeddings.
    embeddings = model.get_input_embeddings().weight
    for name, p in model.named_parameters():
        if p is embeddings:
            name = model.base_model_prefix + ".embeddings.word_embeddings.weight"
        names.append(name)
        tensors["grad." + name] = fam.f32(p.grad if p.grad is not None else torch.zeros_like(p))
    losses, final, params = fam.adamw_run(model, init_state, batch)
    assert abs(losses[0] - out.loss.item()) < 1e-6
    tensors["adamw_losses"] = fam.f32(losses)
    tensors["adamw_final_loss"] = fam.f32([final])
    save_file(tensors, os.path.join(out_dir, "golden.safetensors"),
              metadata={"generator": "tests/golden/make_golden_mlm.py", "torch": torch.__version__,
                        "transformers": transformers.__version__})
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump({"generator": "tests/golden/make_golden_mlm.py", "architecture": type(model).__name__,
                   "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                   "labels": labels.tolist(), "loss": out.loss.item(), "masked": int((labels != -100).sum()),
                   "adamw": {"losses": losses, "final_loss": final}, "parameters": names}, f, indent=1)
        f.write("\n")
    return {"case": arch, "loss": out.loss.item(), "masked": int((labels != -100).sum()), "adamw_final_loss": final}


def write_ner_case(arch, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    fam.COMMON["num_labels"] = 5
    if arch == "bert":
        cfg = BertConfig(**dict(fam.COMMON), max_position_embeddings=fam.T + 2, type_vocab_size=2, pad_token_id=0)
        cfg._attn_implementation = "eager"
        model = BertForTokenClassification(cfg)
    else:
        cfg, seq = fam.make_model(arch)
        cfg.num_labels = 5
        cls = {"roberta": RobertaForTokenClassification, "xlm-roberta": XLMRobertaForTokenClassification,
               "distilbert": DistilBertForTokenClassification, "electra": ElectraForTokenClassification}[arch]
        model = cls(cfg)
    cfg.architectures = [type(model).__name__]
    fam.perturb(model, torch.Generator().manual_seed(1234))
    batch, types = fam.make_batch("electra" if arch == "bert" else arch, cfg, torch.Generator().manual_seed(42))
    gen = torch.Generator().manual_seed(11)
    labels = torch.full((fam.B, fam.T), -100, dtype=torch.long)
    for b in range(fam.B):
        n = int(batch["attention_mask"][b].sum())
        for t in range(1, n - 1):
            if torch.rand(1, generator=gen).item() < 0.7:
                labels[b, t] = int(torch.randint(0, 5, (1,), generator=gen))
        labels[b, 1] = 1
    batch["labels"] = labels
    model.save_pretrained(out_dir)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _, info = type(model).from_pretrained(out_dir, output_loading_info=True, attn_implementation="eager")
    assert not {k: v for k, v in info.items() if v}, (arch, info)
    model.train()
    out = model(**batch)
    out.loss.backward()
    tensors = {k: v.clone().contiguous() for k, v in batch.items() if k != "token_type_ids"}
    tensors["token_type_ids"] = types.clone().contiguous()
    tensors["logits"] = fam.f32(out.logits.detach())
    tensors["loss"] = fam.f32(out.loss.detach()).reshape(1)
    for name, p in model.named_parameters():
        tensors["grad." + name] = fam.f32(p.grad if p.grad is not None else torch.zeros_like(p))
    losses, final, _ = fam.adamw_run(model, init_state, batch)
    tensors["adamw_losses"] = fam.f32(losses)
    tensors["adamw_final_loss"] = fam.f32([final])
    save_file(tensors, os.path.join(out_dir, "golden.safetensors"),
              metadata={"generator": "tests/golden/make_golden_mlm.py", "torch": torch.__version__,
                        "transformers": transformers.__version__})
    return {"case": arch + "-ner", "loss": out.loss.item(), "adamw_final_loss": final}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                              "data", "golden_mlm")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    only = set(sys.argv[2:])
    for arch in ("bert", "roberta", "xlm-roberta", "distilbert"):
        if not only or arch + "-mlm" in only:
            print(json.dumps(write_case(arch, os.path.join(os.path.normpath(out), arch + "-mlm"))))
    for arch in ("bert", "roberta", "xlm-roberta", "distilbert", "electra"):
        if not only or arch + "-ner" in only:
            print(json.dumps(write_ner_case(arch, os.path.join(os.path.normpath(out), arch + "-ner"))))


if __name__ == "__main__":
    main()
