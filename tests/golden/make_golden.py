#!/usr/bin/env python3
"""Write the golden fixture that anchors anatomy's BERT to Hugging Face transformers.

    python3 tests/golden/make_golden.py [OUT_DIR]        (default: tests/data/golden)

Runs on the CPU in float32, deterministically (needs torch, transformers, safetensors).
Writes into OUT_DIR:

  config.json, model.safetensors   model.save_pretrained(): HF config and initial weights
                                   (HF parameter names), the weights every value below starts from.
  golden.safetensors               inputs, outputs, every gradient, optimizer trajectories
                                   (key list in KEYS_DOC below and in golden.json["keys"]).
  golden.json                      human-readable summary (config, losses, versions).

The model is a tiny BertForSequenceClassification (eager attention, dropout 0). Its random
init is perturbed (LayerNorm gammas/betas and every bias get random values) so that zero
biases and unit gammas cannot hide bugs. The optimizer runs follow the HF Trainer recipe:
two parameter groups (no weight decay for biases and LayerNorm parameters, as
Trainer.get_decay_parameter_names), clip_grad_norm_(1.0) before every step, constant LR.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification

KEYS_DOC = {
    "input_ids": "I64 [B,T]",
    "token_type_ids": "I64 [B,T]",
    "attention_mask": "I64 [B,T] (1 = token, 0 = padding)",
    "labels": "I64 [B]",
    "logits": "F32 [B,num_labels], train-mode forward (dropout probabilities are 0)",
    "loss": "F32 [1], CrossEntropyLoss mean over the batch",
    "last_hidden_state": "F32 [B,T,H], encoder output (padded positions included)",
    "pooler_output": "F32 [B,H], tanh(dense(last_hidden_state[:,0]))",
    "hidden_states.{i}": "F32 [B,T,H], i = 0 embeddings output (after LayerNorm), i = l+1 output of layer l",
    "grad.{name}": "F32, d loss / d parameter for every named parameter (HF name, same shape)",
    "adamw_losses": "F32 [5], loss before each of the 5 AdamW steps (adamw_losses[0] == loss)",
    "adamw_grad_norms": "F32 [5], total L2 grad norm before clipping (clip_grad_norm_ return value)",
    "adamw_final_loss": "F32 [1], loss after the 5th AdamW step",
    "adamw_final.{name}": "F32, every parameter after the 5 AdamW steps",
    "sgd_losses": "F32 [5], same for SGD momentum 0.9, lr 1e-2, no weight decay, with clipping",
    "sgd_grad_norms": "F32 [5]",
    "sgd_final_loss": "F32 [1]",
}

B, T = 3, 12
STEPS = 5
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
SGD = dict(lr=1e-2, momentum=0.9)
MAX_GRAD_NORM = 1.0


def make_config():
    cfg = BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        type_vocab_size=2,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        # Larger than BERT's 0.02 so that with hidden size 32 the attention scores, GELU
        # inputs and logits are far from their small-signal (near-linear) regime.
        initializer_range=0.2,
        pad_token_id=0,
    )
    cfg._attn_implementation = "eager"
    return cfg


def perturb(model, gen):
    """Random LayerNorm gammas/betas and biases (HF init sets them to exactly 1 and 0)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def make_batch(gen):
    input_ids = torch.randint(1, 128, (B, T), generator=gen, dtype=torch.long)
    token_type_ids = torch.zeros(B, T, dtype=torch.long)
    token_type_ids[1, T // 2:] = 1
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, T - 4:] = 0
    attention_mask[2, T - 7:] = 0
    labels = torch.tensor([0, 2, 1], dtype=torch.long)
    return dict(input_ids=input_ids, token_type_ids=token_type_ids,
                attention_mask=attention_mask, labels=labels)


def no_decay(name):
    """HF Trainer.get_decay_parameter_names excludes nn.LayerNorm parameters and names that
    contain 'bias' / 'layernorm' / 'norm' patterns: for BERT, every bias and LayerNorm param."""
    return "bias" in name or "layernorm" in name.lower()


def param_groups(model, weight_decay):
    decay = [p for n, p in model.named_parameters() if not no_decay(n)]
    nodecay = [p for n, p in model.named_parameters() if no_decay(n)]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": nodecay, "weight_decay": 0.0}]


def run_optimizer(model, init_state, batch, make_opt):
    """Restore the initial weights, then STEPS x (forward, backward, clip, step)."""
    model.load_state_dict(init_state)
    model.train()
    opt = make_opt(model)
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=MAX_GRAD_NORM)
        opt.step()
        losses.append(loss.item())
        norms.append(float(norm))
    with torch.no_grad():
        final = model(**batch).loss.item()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return losses, norms, final, params


def f32(x):
    """A float32 copy with its own storage (safetensors refuses shared storage)."""
    return torch.as_tensor(x, dtype=torch.float32).detach().clone().contiguous()


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden")
    out_dir = os.path.normpath(out_dir)
    os.makedirs(out_dir, exist_ok=True)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)

    cfg = make_config()
    model = BertForSequenceClassification(cfg).to(torch.float32)  # random init under seed 0
    gen = torch.Generator().manual_seed(1234)
    perturb(model, gen)
    batch = make_batch(torch.Generator().manual_seed(42))

    # Save before any forward with labels (which would set config.problem_type).
    model.save_pretrained(out_dir)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    # ---- forward / backward -------------------------------------------------------------
    captured = {}

    def hook(_module, _inputs, output):
        last, pooled = (output[0], output[1]) if isinstance(output, tuple) else (
            output.last_hidden_state, output.pooler_output)
        captured["last_hidden_state"] = last.detach().clone()
        captured["pooler_output"] = pooled.detach().clone()

    handle = model.bert.register_forward_hook(hook)
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(**batch, output_hidden_states=True)
    out.loss.backward()
    handle.remove()

    tensors = {k: v.clone().contiguous() for k, v in batch.items()}
    tensors["logits"] = f32(out.logits.detach())
    tensors["loss"] = f32(out.loss.detach()).reshape(1)
    tensors["last_hidden_state"] = f32(captured["last_hidden_state"])
    tensors["pooler_output"] = f32(captured["pooler_output"])
    for i, h in enumerate(out.hidden_states or ()):
        tensors[f"hidden_states.{i}"] = f32(h.detach())
    param_names = []
    for name, p in model.named_parameters():
        param_names.append(name)
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        tensors["grad." + name] = f32(g.detach())
    # Every parameter is in model.safetensors; anything else there (none expected) is noted.
    assert set(param_names) <= set(init_state.keys()), set(param_names) - set(init_state.keys())
    extra_keys = sorted(set(init_state.keys()) - set(param_names))

    # ---- optimizer trajectories --------------------------------------------------------
    def make_adamw(m):
        return torch.optim.AdamW(param_groups(m, ADAMW["weight_decay"]), lr=ADAMW["lr"],
                                 betas=ADAMW["betas"], eps=ADAMW["eps"],
                                 foreach=False, fused=False)

    def make_sgd(m):
        return torch.optim.SGD(m.parameters(), lr=SGD["lr"], momentum=SGD["momentum"],
                               weight_decay=0.0, foreach=False)

    a_losses, a_norms, a_final, a_params = run_optimizer(model, init_state, batch, make_adamw)
    s_losses, s_norms, s_final, _ = run_optimizer(model, init_state, batch, make_sgd)
    assert abs(a_losses[0] - out.loss.item()) < 1e-6 and abs(s_losses[0] - out.loss.item()) < 1e-6

    tensors["adamw_losses"] = f32(a_losses)
    tensors["adamw_grad_norms"] = f32(a_norms)
    tensors["adamw_final_loss"] = f32([a_final])
    for name, p in a_params.items():
        tensors["adamw_final." + name] = f32(p)
    tensors["sgd_losses"] = f32(s_losses)
    tensors["sgd_grad_norms"] = f32(s_norms)
    tensors["sgd_final_loss"] = f32([s_final])

    save_file(tensors, os.path.join(out_dir, "golden.safetensors"),
              metadata={"generator": "tests/golden/make_golden.py",
                        "torch": torch.__version__, "transformers": transformers.__version__})

    summary = {
        "generator": "tests/golden/make_golden.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "config": json.loads(cfg.to_json_string(use_diff=False)),
        "attn_implementation": "eager",
        "num_labels": cfg.num_labels,  # config.json has no num_labels key in transformers 5: len(id2label)
        "batch": {"B": B, "T": T,
                  "token_type_ids": "sample 1: ones on positions T/2..T-1, others all 0",
                  "attention_mask": "sample 0 all ones; sample 1 last 4 zero; sample 2 last 7 zero",
                  "labels": batch["labels"].tolist()},
        "init": "BertForSequenceClassification(config) under torch.manual_seed(0), then "
                "LayerNorm.weight = 1 + 0.2*randn, every bias = 0.1*randn "
                "(torch.Generator seed 1234, parameters in named_parameters order)",
        "loss": out.loss.item(),
        "logits": out.logits.detach().tolist(),
        "adamw": {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in ADAMW.items()},
                  "max_grad_norm": MAX_GRAD_NORM, "schedule": "constant",
                  "no_decay": "names containing 'bias' or 'LayerNorm' (HF Trainer rule)",
                  "implementation": "torch.optim.AdamW(foreach=False, fused=False)",
                  "losses": a_losses, "grad_norms": a_norms, "final_loss": a_final},
        "sgd": {**SGD, "weight_decay": 0.0, "dampening": 0.0, "nesterov": False,
                "max_grad_norm": MAX_GRAD_NORM, "schedule": "constant",
                "losses": s_losses, "grad_norms": s_norms, "final_loss": s_final},
        "parameters": {n: list(init_state[n].shape) for n in param_names},
        "non_parameter_keys_in_model_safetensors": extra_keys,
        "keys": KEYS_DOC,
    }
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")

    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(json.dumps({"out_dir": out_dir, "bytes": size, "loss": out.loss.item(),
                      "adamw_losses": a_losses, "adamw_final_loss": a_final,
                      "sgd_losses": s_losses, "sgd_final_loss": s_final}))


if __name__ == "__main__":
    main()
