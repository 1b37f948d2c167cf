#!/usr/bin/env python3
"""Training on real text of varied length: anatomy vs the Hugging Face Trainer, same GPU, same call.

    python3 bench/real_text.py --data DIR --anatomy-bin BIN --vocab VOCAB [--out DIR]
                               [--models bert-base,minilm] [--epochs 3] [--only all|hf|anatomy]

DIR holds train.jsonl and validation.jsonl (bench/fortunes_dataset.py). Each model shape is
initialised once by transformers (BertForSequenceClassification, torch seed 0, one label per
topic) and saved with VOCAB as a model directory, so every run starts from the same weights:

  bert-base  12 layers, hidden 768, 12 heads of 64, FFN 3072
  minilm     6 layers, hidden 384, 12 heads of 32, FFN 1536 (the MiniLM shape)
  small      4 layers, hidden 512, 8 heads of 64, FFN 2048 (tiny: 2 layers, hidden 128)
  modernbert ModernBertForSequenceClassification in modernbert-base's shape (22 layers, hidden 768,
             12 heads of 64, gated FFN 1152, a global layer every 3rd, local window 128, mean pooling)
             with the same WordPiece vocabulary

With --mlm-epochs N each model is first pretrained from those weights by anatomy's masked LM on the
train texts (bf16, real tokens, batch 32, --mlm-lr, warm-up 0.1, N epochs; its perplexity on the
validation texts is printed), and the classifier starts from that encoder: transformers loads it
as BertForSequenceClassification (pooler and classifier initialised with torch seed 0) and saves
the model every run below starts from (domain pretraining before fine-tuning; from random weights
the shapes above learn the topics too, given a warm-up).

Runs (bf16, batch 32, max length 256, AdamW lr 1e-4 (--lr), linear schedule (--warmup-ratio), --epochs epochs,
at each seed of --seeds, default 0; a seed sets the data order and dropout, never the weights):
  trainer random   Trainer, random order, dynamic padding (DataCollatorWithPadding)
  trainer grouped  Trainer, group_by_length=True
  anatomy tokens   anatomy, random order, on the batch's real tokens (its default with a text file)
  anatomy padded   anatomy, random order, each batch padded to its longest sample (--no-skip-padding)
  anatomy grouped  anatomy, --group-by-length --no-skip-padding
Steady samples/s: samples of the second half of the optimizer steps over their wall time (the
Trainer's through a callback that synchronizes the GPU at each step end; anatomy's
steady_samples_per_second in train_results.json, the same definition: its evaluation at each
epoch's end is not counted, and the Trainer here evaluates only after training). Each anatomy
configuration runs --repeat times (default 3); its row is the median run, every run's figure
beside it. Accuracy: validation, after the last epoch. Writes OUT/real_text.md (the table, and with
several seeds each run's accuracy over them: mean, lowest, highest) and OUT/real_text.jsonl (one line a run).
"""
import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

SHAPES = {
    "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    "minilm": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536),
    "tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512),  # smoke test
    # learns this task from random weights at lr 1e-3 (the larger shapes barely move): fp8 vs bf16 curves
    "small": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "modernbert": dict(num_hidden_layers=22, hidden_size=768, num_attention_heads=12, intermediate_size=1152),
    "modernbert-tiny": dict(num_hidden_layers=3, hidden_size=128, num_attention_heads=2, intermediate_size=192),
}
BATCH, MAX_LEN = 32, 256


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def label_maps(labels):
    """config.json's id2label and label2id for the sorted topic names."""
    return dict(id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)})


def make_model(name, labels, vocab, root):
    import torch
    import transformers
    from transformers import BertTokenizerFast
    out = os.path.join(root, name)
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return out
    words = [w.rstrip("\n") for w in open(vocab, encoding="utf-8")]
    common = dict(vocab_size=len(words), max_position_embeddings=512, num_labels=len(labels), **label_maps(labels),
                  **SHAPES[name])
    # The vocabulary positionally: transformers 5 ignores vocab_file= and keeps the five special tokens only.
    tok = BertTokenizerFast(vocab, do_lower_case=True)
    if len(tok) != len(words):
        raise RuntimeError(f"the tokenizer made from {vocab} has {len(tok)} tokens, not its {len(words)}")
    if name.startswith("modernbert"):
        ids = {w: words.index(w) for w in ("[PAD]", "[CLS]", "[SEP]")}
        cfg = transformers.ModernBertConfig(pad_token_id=ids["[PAD]"], bos_token_id=ids["[CLS]"], cls_token_id=ids["[CLS]"],
                                            eos_token_id=ids["[SEP]"], sep_token_id=ids["[SEP]"],
                                            global_attn_every_n_layers=3, local_attention=128,
                                            classifier_pooling="mean", **common)
        model = transformers.ModernBertForSequenceClassification
        tok.model_input_names = ["input_ids", "attention_mask"]  # no token types
    else:
        cfg, model = transformers.BertConfig(**common), transformers.BertForSequenceClassification
    torch.manual_seed(0)
    model(cfg).save_pretrained(out, safe_serialization=True)
    shutil.copy(vocab, os.path.join(out, "vocab.txt"))
    tok.save_pretrained(out)
    return out


def token_lengths(model_dir, texts):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    return sorted(len(ids) for ids in tok(texts, truncation=True, max_length=MAX_LEN)["input_ids"])


def pretrain_mlm(binary, model_dir, data_dir, labels, epochs, lr, root):
    """anatomy's masked LM from model_dir's weights, then the classification model transformers makes of it."""
    import torch
    import transformers
    mlm, out = os.path.join(root, "mlm"), os.path.join(root, "classifier")
    if os.path.exists(os.path.join(out, "model.safetensors")):  # this work dir's earlier run, same settings
        return out, json.load(open(os.path.join(mlm, "all_results.json")))
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    cmd = [binary, "train", "--task", "mlm", "--model-name-or-path", model_dir,
           "--train-file", os.path.join(data_dir, "train.jsonl"), "--validation-file", os.path.join(data_dir, "validation.jsonl"),
           "--max-seq-length", str(MAX_LEN), "--per-device-train-batch-size", str(BATCH), "--num-train-epochs", str(epochs),
           "--learning-rate", str(lr), "--warmup-ratio", "0.1", "--precision", "bf16", "--device", "cuda", "--seed", "0",
           "--eval-strategy", "no", "--save-strategy", "final", "--logging-steps", "0", "--disable-tqdm", "--line-by-line",
           "--output-dir", mlm, "--dataset-cache-dir", os.path.join(root, "cache")]
    with open(os.path.join(root, "mlm.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=400).returncode
    if rc != 0:
        raise RuntimeError(f"masked-LM pretraining exited {rc}; see {root}/mlm.log")
    r = json.load(open(os.path.join(mlm, "all_results.json")))
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification.from_pretrained(mlm, num_labels=len(labels), **label_maps(labels))
    model.save_pretrained(out, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out, r


def eval_variants(model, tok, valid, cuda):
    """The trained model's validation accuracy computed more ways, to tell a prediction problem
    from a training one: in fp32 without autocast, batches of 64 padded as the Trainer pads them
    ("fp32 padded"); in fp32 one sample at a time, no padding ("fp32 alone"); in bf16 autocast one
    sample at a time ("bf16 alone"); fp32 padded with the model in training mode ("fp32 train mode":
    dropout on where the config has any); and the share of the most predicted class in each."""
    import torch
    from transformers import DataCollatorWithPadding
    dev = "cuda" if cuda else "cpu"
    model = model.to(dev).float().eval()
    collate = DataCollatorWithPadding(tok)
    out = {}
    for name, batch, autocast, train_mode in (("fp32 padded", 64, False, False), ("fp32 alone", 1, False, False),
                                              ("bf16 alone", 1, cuda, False), ("fp32 train mode", 64, False, True)):
        model.train(train_mode)
        preds = []
        with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
            for i in range(0, len(valid), batch):
                b = collate([{k: v for k, v in r.items() if k != "labels"} for r in valid[i:i + batch]])
                preds += model(**{k: v.to(dev) for k, v in b.items()}).logits.argmax(-1).tolist()
        out[f"accuracy {name}"] = sum(p == r["labels"] for p, r in zip(preds, valid)) / len(valid)
        out[f"top class share {name}"] = max(preds.count(c) for c in set(preds)) / len(preds)
    model.eval()
    return out


def run_trainer(model_dir, data, labels, grouped, epochs, workdir, cuda, lr, warmup=0.0, seed=0, check_eval=False,
                logging_steps=0):
    import torch
    import transformers
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              TrainerCallback, TrainingArguments)
    tok = AutoTokenizer.from_pretrained(model_dir)
    lid = {l: i for i, l in enumerate(labels)}

    def encode(rows):  # the tokenizer's model inputs (ModernBERT's: no token types), and the label
        enc = tok([r["text"] for r in rows], truncation=True, max_length=MAX_LEN)
        keys = [k for k in enc.keys() if k in tok.model_input_names]
        return [dict({k: enc[k][i] for k in keys}, labels=lid[r["label"]]) for i, r in enumerate(rows)]

    train, valid = encode(data["train"]), encode(data["validation"])
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)

    class Clock(TrainerCallback):
        def __init__(self):
            self.t = []

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self.t.append(time.perf_counter())

    clock = Clock()
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    kw = dict(output_dir=workdir, per_device_train_batch_size=BATCH, per_device_eval_batch_size=64,
              num_train_epochs=epochs, learning_rate=lr, bf16=cuda, use_cpu=not cuda, logging_steps=10**9,
              save_strategy="no", eval_strategy="no", report_to=[], seed=seed, disable_tqdm=True)
    # transformers 5 has no warmup_ratio: its warmup_steps takes a float below 1 as the ratio.
    kw["warmup_ratio" if "warmup_ratio" in fields else "warmup_steps"] = warmup
    # Length grouping: `group_by_length` in transformers 4; its replacement is found by name.
    if "group_by_length" in fields:
        kw["group_by_length"] = grouped
    elif "train_sampling_strategy" in fields:
        kw["train_sampling_strategy"] = "group_by_length" if grouped else "random"
    elif grouped:
        raise RuntimeError("no length-grouping argument among TrainingArguments' fields: " +
                           ", ".join(sorted(f for f in fields if "length" in f or "sampl" in f or "group" in f)))
    dropped = sorted(k for k in kw if k not in fields)  # a setting left out silently would change the run
    if dropped:
        raise RuntimeError(f"TrainingArguments of transformers {transformers.__version__} has no {', '.join(dropped)}")
    compute_metrics = None
    if logging_steps > 0:
        # The loss, gradient norm and learning rate every logging_steps, a non-finite loss logged as
        # it is (the Trainer's default replaces it), and the validation loss and accuracy every
        # 2 logging_steps: where a run goes wrong. The evaluations fall inside the timed steps.
        kw.update(logging_steps=logging_steps, logging_nan_inf_filter=False, eval_strategy="steps",
                  eval_steps=2 * logging_steps)

        def compute_metrics(ev):
            return {"accuracy": float((ev.predictions.argmax(-1) == ev.label_ids).mean())}
    args = TrainingArguments(**kw)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=valid,
                      data_collator=DataCollatorWithPadding(tok), callbacks=[clock], compute_metrics=compute_metrics)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    if logging_steps > 0:
        with open(os.path.join(workdir, "log_history.json"), "w") as f:
            json.dump(trainer.state.log_history, f, indent=0)
    pred = trainer.predict(valid)
    acc = float((pred.predictions.argmax(-1) == pred.label_ids).mean())
    checks = eval_variants(trainer.model, tok, valid, cuda) if check_eval else {}
    if checks:
        print(f"trainer predictions: predict() {acc:.3f}; " + ", ".join(f"{k} {v:.3f}" for k, v in checks.items()),
              flush=True)
    steps = len(clock.t)
    half = steps // 2
    # Samples per step: BATCH except a short last batch of each epoch; the second half's count
    # is taken from the step sizes the sampler produced.
    per_epoch = len(train)
    steps_per_epoch = -(-per_epoch // BATCH)
    sizes = [BATCH if (i % steps_per_epoch) < steps_per_epoch - 1 else per_epoch - BATCH * (steps_per_epoch - 1)
             for i in range(steps)]
    span = clock.t[-1] - clock.t[half] if steps > 2 else 0.0
    steady = sum(sizes[half + 1:]) / span if span > 0 else float("nan")  # (nan: too few steps to time)
    return dict(samples_per_second=len(train) * epochs / wall, steady_samples_per_second=steady, accuracy=acc,
                steps=steps, wall_s=wall, **checks)


def run_anatomy(binary, model_dir, data_dir, flags, epochs, workdir, cuda, lr, precision="bf16", logging_steps=0,
                warmup=0.0, seed=0):
    out = os.path.join(workdir, "out")
    cmd = [binary, "train", "--model-name-or-path", model_dir, "--train-file", os.path.join(data_dir, "train.jsonl"),
           "--validation-file", os.path.join(data_dir, "validation.jsonl"), "--eval-strategy", "epoch",
           "--max-seq-length", str(MAX_LEN), "--per-device-train-batch-size", str(BATCH),
           "--per-device-eval-batch-size", "64", "--num-train-epochs", str(epochs),
           "--learning-rate", str(lr), "--warmup-ratio", str(warmup), "--seed", str(seed), "--device", "cuda" if cuda else "cpu", "--save-strategy", "no",
           "--logging-steps", str(logging_steps), "--disable-tqdm", "--output-dir", out,
           "--dataset-cache-dir", os.path.join(workdir, "cache")]
    # fp8-e4m3: --precision fp8 with E4M3 output gradients (--fp8-format e4m3)
    if not cuda:
        cmd += ["--precision", "fp32"]
    elif precision == "fp8-e4m3":
        cmd += ["--precision", "fp8", "--fp8-format", "e4m3"]
    else:
        cmd += ["--precision", precision]
    cmd += flags
    t0 = time.perf_counter()
    with open(os.path.join(workdir, "anatomy.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=300).returncode
    if rc != 0:
        raise RuntimeError(f"anatomy exited {rc}; see {workdir}/anatomy.log")
    for line in open(os.path.join(workdir, "anatomy.log"), encoding="utf-8", errors="replace"):
        if line.startswith("anatomy: warning"):  # e.g. Note [unknown-token share]
            print(line.rstrip(), flush=True)
    r = json.load(open(os.path.join(out, "train_results.json")))
    return dict(samples_per_second=r["train_samples_per_second"], steady_samples_per_second=r["steady_samples_per_second"],
                accuracy=r.get("eval_accuracy"), eval_loss=r.get("eval_loss"), steps=r.get("steps"),
                wall_s=time.perf_counter() - t0)


def seed_summary(rows):
    """Each (model, run)'s validation accuracy over the seeds: mean, lowest, highest; and its median steady speed."""
    groups = {}
    for r in rows:
        if "error" not in r and r["accuracy"] is not None:
            groups.setdefault((r["model"], r["run"]), []).append(r)
    out = ["\n| model | run | seeds | accuracy mean | lowest | highest | steady samples/s (median) |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for (model, run), rs in groups.items():
        acc = [r["accuracy"] for r in rs]
        speed = sorted(r["steady_samples_per_second"] for r in rs)
        out.append(f"| {model} | {run} | {len(rs)} | {sum(acc) / len(acc):.3f} | {min(acc):.3f} | {max(acc):.3f} | "
                   f"{speed[len(speed) // 2]:.0f} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--anatomy-bin", required=True)
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    ap.add_argument("--models", default="bert-base,minilm")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (AdamW, linear decay), both trainers")
    ap.add_argument("--warmup-ratio", type=float, default=0.0, help="linear warm-up, a fraction of the steps, both trainers")
    ap.add_argument("--mlm-epochs", type=int, default=0,
                    help="first pretrain each model by anatomy's masked LM on the train texts for N epochs (GPU)")
    ap.add_argument("--mlm-lr", type=float, default=1e-4, help="the masked-LM pretraining's peak learning rate")
    ap.add_argument("--only", choices=("all", "hf", "anatomy"), default="all")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: fp32, a smoke test of this script")
    ap.add_argument("--limit", type=int, default=0, help="use the first N train samples only (smoke test)")
    ap.add_argument("--trainer-runs", default="random,grouped", help="which Trainer configurations to run")
    ap.add_argument("--anatomy-runs", default="tokens,padded,grouped", help="which anatomy configurations to run")
    ap.add_argument("--seeds", "--seed", default="0",
                    help="comma-separated seeds: every run at each (data order, dropout; the weights stay seed 0's)")
    ap.add_argument("--precision", default="bf16", help="anatomy's --precision on the GPU: bf16, fp8 or fp8-e4m3 (fp8 with --fp8-format e4m3)")
    ap.add_argument("--logging-steps", type=int, default=0,
                    help="anatomy's --logging-steps, and the Trainer's (with an evaluation every 2 of them, inside its "
                         "timed steps); > 0 keeps each run's loss curve in --out (metrics.jsonl, trainer_log_history.json)")
    ap.add_argument("--trainer-eval-check", action="store_true",
                    help="also score the Trainer's model in fp32 (padded batches, one sample at a time, and padded in "
                         "training mode) and in bf16 one at a time, beside trainer.predict()")
    ap.add_argument("--repeat", type=int, default=3,
                    help="run each anatomy configuration N times; its row is the run of median steady samples/s")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds: comma-separated integers, not {args.seeds!r}")
    if args.mlm_epochs and not cuda:
        ap.error("--mlm-epochs pretrains on the GPU (bf16): leave it out with --device cpu")
    os.makedirs(args.out, exist_ok=True)
    data = {s: read_jsonl(os.path.join(args.data, f"{s}.jsonl")) for s in ("train", "validation")}
    labels = sorted({r["label"] for r in data["train"]})
    if args.limit:
        data["train"] = data["train"][:args.limit]
    work = "/tmp/real_text"
    data_dir = args.data
    if args.limit:  # anatomy reads files: write the cut train set beside the work dir
        data_dir = os.path.join(work, "data")
        os.makedirs(data_dir, exist_ok=True)
        for s in ("train", "validation"):
            with open(os.path.join(data_dir, f"{s}.jsonl"), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in data[s])
    rows, mlm_notes = [], []
    jsonl = open(os.path.join(args.out, "real_text.jsonl"), "w")
    for name in args.models.split(","):
        model_dir = make_model(name, labels, args.vocab, os.path.join(work, "models"))
        mlm_note = ""
        if args.mlm_epochs:
            model_dir, m = pretrain_mlm(args.anatomy_bin, model_dir, data_dir, labels, args.mlm_epochs, args.mlm_lr,
                                        os.path.join(work, "pretrained", f"{name}_e{args.mlm_epochs}_lr{args.mlm_lr}"))
            mlm_note = (f"{name}: pretrained by masked LM, {args.mlm_epochs} epochs at lr {args.mlm_lr}: "
                        f"{m.get('train_samples_per_second', 0):.0f} samples/s, validation perplexity "
                        f"{m.get('perplexity', float('nan')):.1f} (loss {m.get('eval_loss', float('nan')):.3f})")
            print(mlm_note, flush=True)
            mlm_notes.append(mlm_note)
        lens = token_lengths(model_dir, [r["text"] for r in data["train"]])
        print(f"{name}: {len(data['train'])} train / {len(data['validation'])} validation samples, {len(labels)} labels; "
              f"tokens per sample (with [CLS]/[SEP], cut at {MAX_LEN}): mean {sum(lens) / len(lens):.1f}, "
              f"median {lens[len(lens) // 2]}, max {lens[-1]}", flush=True)
        runs = []
        if args.only in ("all", "hf"):
            for grouped in (False, True):
                if ("grouped" if grouped else "random") in args.trainer_runs.split(","):
                    runs.append(("trainer grouped" if grouped else "trainer random",
                                 lambda w, seed, g=grouped: run_trainer(model_dir, data, labels, g, args.epochs, w, cuda,
                                                                        args.lr, args.warmup_ratio, seed,
                                                                        args.trainer_eval_check, args.logging_steps)))
        if args.only in ("all", "anatomy"):
            chosen = args.anatomy_runs.split(",")
            for run_name, flags in (("anatomy tokens", []), ("anatomy padded", ["--no-skip-padding"]),
                                    ("anatomy grouped", ["--group-by-length", "--no-skip-padding"])):
                if run_name.split()[1] not in chosen:
                    continue
                runs.append((run_name, lambda w, seed, f=flags: run_anatomy(args.anatomy_bin, model_dir, data_dir, f,
                                                                           args.epochs, w, cuda, args.lr, args.precision,
                                                                           args.logging_steps, args.warmup_ratio, seed)))
        for seed, (run_name, fn) in ((seed, run) for seed in seeds for run in runs):
            w = os.path.join(work, name, run_name.replace(" ", "_"), f"s{seed}")
            shutil.rmtree(w, ignore_errors=True)
            os.makedirs(w)
            repeats = []
            for i in range(args.repeat if run_name.startswith("anatomy") else 1):
                wi = os.path.join(w, f"run{i}")
                os.makedirs(wi)
                failed = None
                try:
                    repeats.append(fn(wi, seed))
                except Exception as e:  # one failed run must not lose the others
                    failed = e
                # With --logging-steps: the loss curves (anatomy's metrics.jsonl, the Trainer's log
                # history), also of a run that failed.
                tag = f"{name}_{args.precision}_{run_name.split()[1]}" + (f"_s{seed}" if len(seeds) > 1 else "")
                for curve, suffix in ((os.path.join(wi, "out", "metrics.jsonl"), "metrics.jsonl"),
                                      (os.path.join(wi, "log_history.json"), "trainer_log_history.json")):
                    if os.path.exists(curve):
                        shutil.copy(curve, os.path.join(args.out, f"{tag}_{i}.{suffix}"))
                if failed is not None:
                    repeats = [dict(error=str(failed))]
                    break
            r = repeats[0]
            if "error" not in r:  # the median run; every run's steady figure beside it
                repeats.sort(key=lambda x: x["steady_samples_per_second"])
                r = dict(repeats[len(repeats) // 2], steady_runs=[round(x["steady_samples_per_second"]) for x in repeats])
            r.update(model=name, run=run_name, seed=seed)
            print(json.dumps(r), flush=True)
            jsonl.write(json.dumps(r) + "\n")
            jsonl.flush()
            rows.append(r)
    with open(os.path.join(args.out, "real_text.md"), "w") as f:
        f.write(f"anatomy --precision {args.precision if cuda else 'fp32'} (the Trainer: {'bf16' if cuda else 'fp32'}), batch {BATCH}, max length {MAX_LEN}, "
                f"{args.epochs} epochs, lr {args.lr}, warm-up ratio {args.warmup_ratio}, same initial weights, "
                f"seeds {args.seeds}\n\n")
        f.writelines(f"{n}\n\n" for n in mlm_notes)
        f.write("| model | run | seed | steady samples/s (each run) | samples/s (whole run) | validation accuracy | validation loss |\n"
                "|---|---|---:|---:|---:|---:|---:|\n")
        for r in rows:
            if "error" in r:
                f.write(f"| {r['model']} | {r['run']} | {r['seed']} | failed: {r['error']} | | | |\n")
            else:
                acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
                loss = "-" if r.get("eval_loss") is None else f"{r['eval_loss']:.4f}"
                runs = r.get("steady_runs", [])
                spread = f" ({' / '.join(str(x) for x in runs)})" if len(runs) > 1 else ""
                f.write(f"| {r['model']} | {r['run']} | {r['seed']} | {r['steady_samples_per_second']:.0f}{spread} | "
                        f"{r['samples_per_second']:.0f} | {acc} | {loss} |\n")
        if len(seeds) > 1:
            f.write(seed_summary(rows))
    print(open(os.path.join(args.out, "real_text.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
