"""In-memory publication into a real SGLang GPU server (scripts/gpu-check.sh runs it).

NEVER RUN YET: written on a machine without a GPU (no device machine was lent to the session
that wrote it). It starts ``python -m sglang.launch_server`` on a model directory, opens the
weight-update group with :class:`gyre.train.weight_sync.DistributedWeightChannel` (NCCL with the
trainer on GPU 0 and the server on GPU 1 when there are two GPUs; gloo when there is one, since
NCCL refuses two ranks of one communicator on the same GPU), publishes the trainer's weights
moved by a visible step, and checks the server serves them: ``/get_weights_by_name`` equals the
trainer's values (to the server's dtype), and its greedy tokens changed. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import torch
from transformers import AutoModelForCausalLM

from gyre.ports import free_ports
from gyre.train.weight_sync import DistributedWeightChannel
from gyre.train.weights import named_params

PROBE = "model.norm.weight"  # not fused by SGLang's loaders (qkv / gate_up are)


def start_server(model: str, port: int, gpu: str) -> subprocess.Popen:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model]
    cmd += ["--port", str(port), "--host", "127.0.0.1", "--mem-fraction-static", "0.3"]
    cmd += ["--disable-cuda-graph", "--dtype", "float32"]
    return subprocess.Popen(cmd, env=env)


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"sglang server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(2)
    raise TimeoutError("sglang server never became healthy")


def greedy(url: str) -> list[int]:
    body = {
        "input_ids": [1, 2, 3, 4, 5],
        "sampling_params": {"max_new_tokens": 8, "temperature": 0},
    }
    return httpx.post(url + "/generate", json=body, timeout=120).json()["output_ids"]


async def publish(url: str, trainer: torch.nn.Module, backend: str, device: str) -> dict:
    ch = DistributedWeightChannel([url], backend=backend, device=device, use_delta=False)
    await ch.connect()
    try:
        stats = await ch.publish(1, named_params(trainer))
    finally:
        await ch.close()
    return {"seconds": stats.seconds, "bytes": stats.payload_bytes, "buckets": stats.buckets}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    gpus = torch.cuda.device_count()
    backend, device, server_gpu = ("nccl", "cuda", "1") if gpus >= 2 else ("gloo", "cpu", "0")
    if backend == "nccl":
        torch.cuda.set_device(0)
    (port,) = free_ports()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(a.model, port, server_gpu)
    out: dict = {"backend": backend, "gpus": gpus}
    try:
        wait_healthy(url, proc)
        before = greedy(url)
        trainer = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
        with torch.no_grad():
            for p in trainer.parameters():
                p.mul_(1.5)  # a visible move: the greedy tokens must change
        out.update(asyncio.run(publish(url, trainer, backend, device)))
        got = httpx.post(
            url + "/get_weights_by_name", json={"name": PROBE, "truncate_size": 16}, timeout=60
        ).json()
        want = dict(trainer.named_parameters())[PROBE].detach().reshape(-1)[:16]
        out["probe_max_diff"] = float((torch.tensor(got).reshape(-1)[:16] - want).abs().max())
        out["tokens_changed"] = greedy(url) != before
        out["ok"] = out["probe_max_diff"] < 1e-6 and out["tokens_changed"]
    except Exception as e:
        out.update(ok=False, error=f"{type(e).__name__}: {e}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
