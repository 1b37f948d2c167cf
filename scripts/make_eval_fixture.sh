#!/usr/bin/env bash
# For inference measurements on the GPU machine: a bert-large model directory (random weights,
# one training step, our vocabulary) in $1 and 4096 texts of 8-500 words from the vocabulary
# (lengths vary as in real corpora) in $2. Usage: make_eval_fixture.sh ANATOMY_BIN MODEL_DIR JSONL
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1 model=$2 data=$3
mkdir -p "$model"
"$a" train --preset bert-large --max-steps 1 --num-samples 8 --seq-len 128 --per-device-train-batch-size 8 \
  --overwrite-output-dir --output-dir "$model" --disable-tqdm --logging-steps 0 > /dev/null 2>&1
cp tests/data/tokenizer/vocab.txt "$model/"
python3 - "$data" <<'PY'
import json, random, sys
random.seed(0)
words = [w.strip() for w in open("tests/data/tokenizer/vocab.txt") if w.strip().isalpha()]
with open(sys.argv[1], "w") as f:
    for i in range(4096):
        n = int(min(500, max(8, random.lognormvariate(4.5, 0.8))))
        f.write(json.dumps({"text": " ".join(random.choices(words, k=n)), "label": i % 2}) + "\n")
PY
