"""Which torch settings make CPU results the same across ATen CPU capabilities? (issue 32 item 3)

    python benchmarks/torch_capability.py                 # every capability, every setting: a table
    python benchmarks/torch_capability.py --json out.json # and the digests as JSON

ATen picks its vectorised kernels once, at import, from the CPU or from ATEN_CPU_CAPABILITY
(default = no vectorisation, avx2, avx512). On one host that variable stands in for CPUs of
different capabilities. For each capability this script starts a fresh interpreter (the variable
must be set before torch is imported) that trains, for every setting, two models from the same
seed and prints one digest per (model, setting) over the parameters and the optimizer's state:

    models    a dropout MLP (784-256-256-10, dropout 0.1) with AdamW; a small transformer encoder
              (2 layers, d_model 64, 4 heads, GELU, LayerNorm, dropout 0.1) with AdamW
    settings  oneDNN (torch.backends.mkldnn.enabled) on/off x intra-op threads 1/2, with
              deterministic algorithms on (as DataParallel sets them), and MKL_CBWR=COMPATIBLE
              (MKL's conditional numerical reproducibility) in its own fresh interpreter

A setting "holds" when all capabilities give one digest for both models. The table says which
hold; docs/same-bits.md records what was measured and what remains machine-dependent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

CAPABILITIES = ("default", "avx2", "avx512")
SETTINGS = [(mkldnn, threads) for mkldnn in (True, False) for threads in (1, 2)]
STEPS = 8


def _digest(model, opt) -> str:
    import torch

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().double().numpy().tobytes())
        for k, v in sorted(opt.state.get(p, {}).items()):
            if isinstance(v, torch.Tensor):
                h.update(k.encode() + v.detach().double().reshape(-1).numpy().tobytes())
    return h.hexdigest()[:16]


def _models(torch):
    nn = torch.nn

    def mlp():
        m = nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 256), nn.ReLU(), nn.Dropout(0.1)
        )
        m.append(nn.Linear(256, 10))
        X, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
        return m, lambda: nn.functional.cross_entropy(m(X), y, reduction="sum")

    def transformer():
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, activation="gelu", batch_first=True)
        enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        head = nn.Linear(64, 10)  # on the mean over the sequence
        X, y = torch.randn(16, 12, 64), torch.randint(0, 10, (16,))
        whole = nn.ModuleDict({"enc": enc, "head": head})
        return whole, lambda: nn.functional.cross_entropy(head(enc(X).mean(1)), y, reduction="sum")

    return {"dropout-mlp": mlp, "transformer": transformer}


def child() -> dict:
    """In a fresh interpreter whose ATEN_CPU_CAPABILITY is set: {setting: {model: digest}}."""
    import torch

    out = {"capability": torch.backends.cpu.get_cpu_capability(), "digests": {}}
    torch.use_deterministic_algorithms(True)
    for mkldnn, threads in SETTINGS:
        torch.backends.mkldnn.enabled = mkldnn
        torch.set_num_threads(threads)
        key = f"onednn {'on' if mkldnn else 'off'}, threads {threads}"
        if os.environ.get("MKL_CBWR"):
            key += f", MKL_CBWR={os.environ['MKL_CBWR']}"
        row = {}
        for name, make in _models(torch).items():
            torch.manual_seed(0)
            model, loss = make()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for _ in range(STEPS):
                opt.zero_grad()
                loss().backward()
                opt.step()
            row[name] = _digest(model, opt)
        out["digests"][key] = row
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None, help="write the digests here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child()))
        return 0
    runs = {}
    for extra in ({}, {"MKL_CBWR": "COMPATIBLE"}):
        for cap in CAPABILITIES:
            env = {**os.environ, "ATEN_CPU_CAPABILITY": cap, **extra}
            r = subprocess.run(
                [sys.executable, __file__, "--child"], capture_output=True, text=True, env=env, check=True
            )
            got = json.loads(r.stdout.strip().splitlines()[-1])
            for key, row in got["digests"].items():
                runs.setdefault(key, {})[got["capability"]] = row
    caps = sorted({c for row in runs.values() for c in row})
    print(f"# digests after {STEPS} AdamW steps (params and optimizer state), per ATen capability")
    print(f"{'setting':<42s}{'model':<14s}" + "".join(f"{c:<18s}" for c in caps) + "same?")
    holds = {}
    for key, by_cap in runs.items():
        for model in ("dropout-mlp", "transformer"):
            ds = [by_cap[c][model] for c in caps]
            same = len(set(ds)) == 1
            holds.setdefault(key, []).append(same)
            print(f"{key:<42s}{model:<14s}" + "".join(f"{d:<18s}" for d in ds) + ("yes" if same else "NO"))
    good = [k for k, v in holds.items() if all(v)]
    print(f"# settings that hold for both models: {good or 'none'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": STEPS, "digests": runs, "hold": good}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
