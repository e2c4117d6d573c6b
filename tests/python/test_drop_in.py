"""The drop-in contract (issue 23): examples/python/gpt.py and cnn.py, PyTorch scripts, run
unedited on Tessera (examples/python/as_tessera.py points torch, torch.nn, torch.nn.functional
and torch.optim at tessera's modules) from the same initial weights and data order as under
torch 1.13 (/usr/bin/python3): the losses of 50 steps agree to 1e-4. The GPT's variant with
F.scaled_dot_product_attention (which torch 1.13 lacks) agrees with its hand-written attention
under Tessera. A Tessera run of the GPT compiles at most 2 graphs over its 50 steps, and the
profiler's op table names its Python modules."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nn_ref import require

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "python"
TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3-torch 1.13 lives there
STEPS = 50
TOL = 1e-4


def run(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def losses(out):
    return [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)$", out, re.M)]


def torch_run(script, *args, steps=STEPS):
    require("torch")
    return losses(run([TORCH_PYTHON, str(EX / script), "--steps", str(steps), *args]))


def tessera_run(script, *args, steps=STEPS):
    return losses(run([sys.executable, str(EX / "as_tessera.py"), str(EX / script), "--steps", str(steps), *args]))


def assert_agree(got, want, what, steps=STEPS):
    assert len(got) == len(want) == steps, (len(got), len(want))
    worst = max(range(steps), key=lambda i: abs(got[i] - want[i]))
    assert abs(got[worst] - want[worst]) <= TOL, (f"{what}: step {worst} loss {got[worst]} vs {want[worst]}\n"
                                                  f"tessera {got}\nwant    {want}")


@pytest.fixture(scope="module")
def gpt_init(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt") / "init.npz"
    return path, torch_run("gpt.py", "--save-init", str(path))


@pytest.fixture(scope="module")
def gpt_tessera(gpt_init):
    return tessera_run("gpt.py", "--load-init", str(gpt_init[0]))


def test_gpt_losses_match_torch(gpt_init, gpt_tessera):
    want = gpt_init[1]
    assert want[-1] < want[0] - 0.5, want  # it learns
    assert_agree(gpt_tessera, want, "gpt.py on Tessera vs torch")


def test_gpt_sdpa_variant_matches_hand_written_attention(gpt_init, gpt_tessera):
    path, want = gpt_init
    sdpa = tessera_run("gpt.py", "--load-init", str(path), "--attention", "sdpa")
    assert_agree(sdpa, gpt_tessera, "gpt.py --attention sdpa vs hand-written attention, both on Tessera")
    assert_agree(sdpa, want, "gpt.py --attention sdpa on Tessera vs hand-written attention on torch")


def require_fashion_mnist():
    if not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists():
        if os.environ.get("CI") == "true":
            pytest.fail("dataset-fashion-mnist is not installed")
        pytest.skip("dataset-fashion-mnist is not installed")


def test_cnn_losses_match_torch(tmp_path):
    require_fashion_mnist()
    path = tmp_path / "init.npz"
    want = torch_run("cnn.py", "--save-init", str(path))
    assert want[-1] < want[0] - 1, want
    assert_agree(tessera_run("cnn.py", "--load-init", str(path)), want, "cnn.py on Tessera vs torch")


def test_cnn_with_batch_norm_matches_torch_while_torch_is_exact_enough(tmp_path):
    """With BatchNorm2d, torch 1.13's own float32 training-mode batch norm is 3e-5 (normalized)
    away from its float64 result on these images (Tessera's: 8e-8), and SGD amplifies the
    difference step by step; so the losses are held to 1e-4 over the first 3 steps only. The
    layer itself is checked to 1e-5 in test_nn_layers.py."""
    require_fashion_mnist()
    path = tmp_path / "init.npz"
    want = torch_run("cnn.py", "--batch-norm", "--save-init", str(path), steps=3)
    got = tessera_run("cnn.py", "--batch-norm", "--load-init", str(path), steps=3)
    assert_agree(got, want, "cnn.py --batch-norm on Tessera vs torch", steps=3)


PROBE = r"""
import json, runpy, sys
sys.argv = [sys.argv[1], "--steps", "50"]
import tessera
runpy.run_path({as_tessera!r})  # the module swap only (not run as __main__)
before = tessera.metrics().graphs_compiled
with tessera.profiler.profile() as prof:
    runpy.run_path(sys.argv[0], run_name="__main__")
print("PROBE " + json.dumps({{"compiled": tessera.metrics().graphs_compiled - before,
                             "modules": [r.name for r in prof.op_table("module")]}}))
"""


def test_gpt_compiles_at_most_two_graphs_and_profiler_names_modules():
    out = run([sys.executable, "-c", PROBE.format(as_tessera=str(EX / "as_tessera.py")), str(EX / "gpt.py")])
    probe = json.loads(out.split("PROBE ", 1)[1])
    assert probe["compiled"] <= 2, probe["compiled"]
    assert "transformer.h.1.attn" in probe["modules"], probe["modules"]
    assert "transformer.h.0.mlp.c_fc" in probe["modules"], probe["modules"]
