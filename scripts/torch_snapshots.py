#!/usr/bin/env python3
"""Record real PyTorch CUDA memory snapshots for replay fixtures.

A randomly initialised GPT-2-class model (no download): inference with
varying batch and sequence lengths, generation with a KV cache, and a few
training steps. Each scenario is recorded with
torch.cuda.memory._record_memory_history (no stack frames, to keep the
files small) and dumped with _dump_snapshot; PyTorch's own
max_memory_allocated / max_memory_reserved go beside them in summary.json.

usage: python3 scripts/torch_snapshots.py OUT_DIR
"""

import json
import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

OUT = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/torch"
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(0)
device = torch.device("cuda")


def model(layers=6, width=512, heads=8):
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=1024)
    return GPT2LMHeadModel(config).to(device=device, dtype=torch.bfloat16)


def record(name, body):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        torch.cuda.memory._record_memory_history(
            enabled="all", context=None, stacks="python", max_entries=200_000
        )
    except TypeError:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    start = time.time()
    body()
    torch.cuda.synchronize()
    path = os.path.join(OUT, f"{name}.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    summary = {
        "file": f"{name}.pickle",
        "bytes": os.path.getsize(path),
        "seconds": round(time.time() - start, 2),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
    }
    print(name, summary, flush=True)
    return summary


def inference():
    net = model().eval()
    with torch.no_grad():
        for batch, seq in [(1, 64), (4, 256), (8, 512), (2, 1024), (16, 128), (1, 512)]:
            ids = torch.randint(0, 50257, (batch, seq), device=device)
            net(ids)
    del net


def generation():
    net = model().eval()
    with torch.no_grad():
        for batch, prompt, new in [(1, 32, 64), (4, 128, 32), (8, 16, 48)]:
            ids = torch.randint(0, 50257, (batch, prompt), device=device)
            net.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0)
    del net


def training():
    net = model(layers=4).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    for step in range(4):
        seq = [128, 256, 192, 256][step]
        ids = torch.randint(0, 50257, (4, seq), device=device)
        loss = net(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    del net, opt


summaries = {
    "torch": torch.__version__,
    "device": torch.cuda.get_device_name(0),
    "snapshots": [record("gpt2_inference", inference), record("gpt2_generate", generation), record("gpt2_training", training)],
}
with open(os.path.join(OUT, "summary.json"), "w") as f:
    json.dump(summaries, f, indent=2)
print(json.dumps(summaries, indent=2))
