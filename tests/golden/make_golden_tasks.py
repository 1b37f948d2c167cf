#!/usr/bin/env python3
"""Write the golden fixtures of the sequence-classification problem types on float labels
(transformers' regression and multi-label heads) in the form of make_golden_family.py's.

    /work/.venv-hf/bin/python tests/golden/make_golden_tasks.py [OUT_DIR [CASE ...]]
                                                    (default: tests/data/golden_tasks, every case)

CASE names a directory below: only those are written, so adding a case leaves the others' files
as they were.

Cases (OUT_DIR/CASE/, the files make_golden_family.py writes; "labels" is F32 [B, num_labels]):
  bert-regression        BertForSequenceClassification, num_labels 1, problem_type unset (so
                         transformers infers regression from num_labels 1): MSE over B.
  roberta-regression2    RobertaForSequenceClassification, num_labels 2, problem_type regression:
                         MSE over B x 2.
  roberta-multilabel     RobertaForSequenceClassification, num_labels 5, problem_type
                         multi_label_classification: BCEWithLogitsLoss over a multi-hot B x 5.
  distilbert-multilabel  DistilBertForSequenceClassification, num_labels 3, multi-label.
  bert-multilabel        BertForSequenceClassification, num_labels 4, multi-label.
  xlm-roberta-regression XLMRobertaForSequenceClassification, num_labels 1, problem_type
                         regression written out (not inferred): MSE over B.
  xlm-roberta-multilabel XLMRobertaForSequenceClassification, num_labels 3, multi-label.
  electra-regression     ElectraForSequenceClassification, num_labels 1, problem_type unset.
  electra-multilabel     ElectraForSequenceClassification, num_labels 4, multi-label.
  distilbert-regression3 DistilBertForSequenceClassification, num_labels 3, problem_type
                         regression: MSE over B x 3.
Sizes, padding, perturbation and the AdamW recipe are make_golden_family.py's.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden_family as fam  # noqa: E402

CASES = {
    "bert-regression": ("bert", 1, None),
    "roberta-regression2": ("roberta", 2, "regression"),
    "roberta-multilabel": ("roberta", 5, "multi_label_classification"),
    "distilbert-multilabel": ("distilbert", 3, "multi_label_classification"),
    "bert-multilabel": ("bert", 4, "multi_label_classification"),
    "xlm-roberta-regression": ("xlm-roberta", 1, "regression"),
    "xlm-roberta-multilabel": ("xlm-roberta", 3, "multi_label_classification"),
    "electra-regression": ("electra", 1, None),
    "electra-multilabel": ("electra", 4, "multi_label_classification"),
    "distilbert-regression3": ("distilbert", 3, "regression"),
}


def make_model(arch, num_labels, problem_type):
    if arch == "bert":
        common = dict(fam.COMMON, num_labels=num_labels)
        cfg = BertConfig(**common, max_position_embeddings=fam.T + 2, type_vocab_size=2, pad_token_id=0)
        cls = BertForSequenceClassification
    else:
        fam.COMMON["num_labels"] = num_labels
        cfg, model = fam.make_model(arch)
        cls = type(model)
        cfg.num_labels = num_labels
    cfg.problem_type = problem_type
    cfg._attn_implementation = "eager"
    return cfg, cls(cfg).to(torch.float32)


def labels_for(problem_type, num_labels, gen, batch=None):
    """Labels F32 [batch (make_golden_family's B by default), num_labels]."""
    batch = fam.B if batch is None else batch
    if problem_type == "multi_label_classification":
        hot = (torch.rand(batch, num_labels, generator=gen) < 0.4).to(torch.float32)
        hot[0, 0] = 1.0  # at least one positive and one negative
        hot[1, 0] = 0.0
        return hot
    return torch.randn(batch, num_labels, generator=gen) * 1.5 + 0.5


def write_case(name, out_dir):
    arch, num_labels, problem_type = CASES[name]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    cfg, model = make_model(arch, num_labels, problem_type)
    fam.perturb(model, torch.Generator().manual_seed(1234))
    batch, types = fam.make_batch("electra" if arch == "bert" else arch, cfg, torch.Generator().manual_seed(42))
    labels = labels_for(problem_type, num_labels, torch.Generator().manual_seed(7))
    # transformers' shapes: [B] for num_labels 1 (squeezed either way), [B, C] otherwise.
    batch["labels"] = labels.squeeze(-1) if num_labels == 1 else labels
    model.save_pretrained(out_dir)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _, info = type(model).from_pretrained(out_dir, output_loading_info=True, attn_implementation="eager")
    assert not {k: v for k, v in info.items() if v}, (name, info)

    model.train()
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    assert model.config.problem_type == (problem_type or "regression"), model.config.problem_type
    tensors = {k: v.clone().contiguous() for k, v in batch.items() if k not in ("token_type_ids", "labels")}
    tensors["labels"] = fam.f32(labels)
    tensors["token_type_ids"] = types.clone().contiguous()
    tensors["logits"] = fam.f32(out.logits.detach())
    tensors["loss"] = fam.f32(out.loss.detach()).reshape(1)
    names = []
    for pname, p in model.named_parameters():
        names.append(pname)
        tensors["grad." + pname] = fam.f32(p.grad if p.grad is not None else torch.zeros_like(p))
    losses, final, params = fam.adamw_run(model, init_state, batch)
    assert abs(losses[0] - out.loss.item()) < 1e-6
    tensors["adamw_losses"] = fam.f32(losses)
    tensors["adamw_final_loss"] = fam.f32([final])
    for pname, p in params.items():
        tensors["adamw_final." + pname] = fam.f32(p)
    save_file(tensors, os.path.join(out_dir, "golden.safetensors"),
              metadata={"generator": "tests/golden/make_golden_tasks.py", "torch": torch.__version__,
                        "transformers": transformers.__version__})
    summary = {
        "generator": "tests/golden/make_golden_tasks.py",
        "architecture": type(model).__name__,
        "problem_type": model.config.problem_type,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "labels": labels.tolist(),
        "loss": out.loss.item(),
        "logits": out.logits.detach().tolist(),
        "adamw": {"losses": losses, "final_loss": final},
        "parameters": names,
    }
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    return {"case": name, "loss": out.loss.item(), "adamw_final_loss": final}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                              "data", "golden_tasks")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    only = sys.argv[2:]
    unknown = [c for c in only if c not in CASES]
    assert not unknown, ("unknown cases", unknown)
    for name in CASES:
        if only and name not in only:
            continue
        print(json.dumps(write_case(name, os.path.join(os.path.normpath(out), name))))


if __name__ == "__main__":
    main()
