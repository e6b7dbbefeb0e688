"""Read what W&B (offline) and MLflow wrote, straight from their files: tests check the
trackers' own records, not Gyre's idea of them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

_BLOCK = 32768  # W&B's .wandb file: a LevelDB-style log of protobuf records in 32 KiB blocks


def _chunks(data: bytes):
    pos, buf = 7, b""  # 7-byte file header: ":W&B", magic, version
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # block trailer too short for a header: padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            yield buf + chunk
            buf = b""


def wandb_runs(run_dir: Path) -> list[dict[str, Any]]:
    """Each offline run directory under ``run_dir/wandb``, oldest first: its run id, config
    keys, history rows and final summary (values decoded from JSON)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for f in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        data = f.read_bytes()
        assert data[:4] == b":W&B", f
        run: dict[str, Any] = {"file": f, "history": [], "summary": {}, "config": {}}
        for chunk in _chunks(data):
            r = pb.Record()
            r.ParseFromString(chunk)
            kind = r.WhichOneof("record_type")
            if kind == "run":
                run["id"] = r.run.run_id
                run["project"] = r.run.project
                run["config"].update({i.key: json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "config":
                run["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
            elif kind == "history":
                run["history"].append(
                    {
                        i.key or "/".join(i.nested_key): json.loads(i.value_json)
                        for i in r.history.item
                    }
                )
            elif kind == "summary":
                run["summary"].update(
                    {
                        i.key or "/".join(i.nested_key): json.loads(i.value_json)
                        for i in r.summary.update
                    }
                )
        out.append(run)
    return out
