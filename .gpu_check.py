# Temporary GPU check of fx/backend.py (deleted after the run; not part of the project).
import os
import sys
import time
import traceback

import torch

sys.path[:0] = ["examples"]
OUT = os.environ.get("OUT", "/tmp")
from egraph_mirage.bench import reference  # noqa: E402
from egraph_mirage.fx.backend import Backend  # noqa: E402
from egraph_mirage.fx.report import torch_report  # noqa: E402
from egraph_mirage.search.results import SearchResult, SearchResults, SearchStats  # noqa: E402
from llama_layer import LlamaLayer, LlamaSizes, hf_decoder_layer  # noqa: E402


def stand_in(make):
    def search(g, config, **kw):
        return SearchResults([SearchResult(make(g), 1, 1e-6, 0.0, 2, 0.0, 0.0)], SearchStats())
    search.__qualname__ = make.__name__
    return search


def fused_rms(g):
    return reference.rmsnorm_linear(g)


def same(g):
    return g


def rms_mm(x, w):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=1e-6) @ w


def us(fn, args):
    import triton.testing
    with torch.no_grad():
        return triton.testing.do_bench(lambda: fn(*args), return_mode="median") * 1e3


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


print(torch.__version__, torch.cuda.get_device_name(), flush=True)
cache = os.path.join(OUT, "cache")
x = torch.randn(8, 4096, device="cuda", dtype=torch.float16)
w = torch.randn(4096, 6144, device="cuda", dtype=torch.float16) / 64
for profile, mode in ((True, None), (False, None), (False, "reduce-overhead")):
    try:
        torch._dynamo.reset()
        from torch._dynamo.utils import counters
        counters.clear()
        b = Backend(search=stand_in(fused_rms), profile=profile, cache_dir=cache)
        c = torch.compile(rms_mm, backend=b, dynamic=False, mode=mode)
        t0 = time.time()
        with torch.no_grad():
            y = c(x, w)
            y = c(x, w)
            y = c(x, w)
            ref = rms_mm(x, w)
        print(f"== rms_mm profile={profile} mode={mode}: compile {time.time() - t0:.1f} s, "
              f"rel err {rel(y, ref):.2e}; compiled {us(c, (x, w)):.1f} us, eager "
              f"{us(rms_mm, (x, w)):.1f} us; cudagraph skips {dict(counters['inductor'])}")
        print(torch_report(c), flush=True)
    except Exception:
        traceback.print_exc()

for tp, batch in ((1, 8),):
    try:
        torch._dynamo.reset()
        layer = LlamaLayer(LlamaSizes.llama3_8b(tp), dtype=torch.float16, device="cuda")
        args = layer.example_inputs(batch=batch)
        b = Backend(search=stand_in(same), cache_dir=cache)
        c = torch.compile(layer, backend=b, dynamic=False)
        t0 = time.time()
        with torch.no_grad():
            got = c(*args)
            want = layer(*args)
        print(f"== llama3_8b tp={tp} batch={batch}: compile {time.time() - t0:.1f} s, rel errs "
              f"{[f'{rel(a, b):.1e}' for a, b in zip(got, want)]}; compiled {us(c, args):.1f} us,"
              f" eager {us(layer, args):.1f} us")
        print(torch_report(c), flush=True)
        torch._dynamo.reset()
        ind = torch.compile(layer, dynamic=False)
        print(f"   inductor alone {us(ind, args):.1f} us", flush=True)
    except Exception:
        traceback.print_exc()

try:
    hf = hf_decoder_layer(LlamaSizes.small())
    print("hf layer:", type(hf).__name__, sum(p.numel() for p in hf.parameters()))
except Exception:
    traceback.print_exc()
