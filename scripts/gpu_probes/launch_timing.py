"""A winner timed through its op and as Inductor launches it: RMSNorm + Linear at 4096 x 4096,
b = 1, fp16, the hand-written fused kernel as the search's stand-in (no search). Prints each
piece report line. Usage (GPU host): PYTHONPATH=. python3 scripts/gpu_probes/launch_timing.py"""
import tempfile

import torch

from egraph_mirage.bench.handwritten_fixtures import rmsnorm_linear
from egraph_mirage.fx.backend import Backend
from egraph_mirage.search.results import SearchResult, SearchResults, SearchStats


def rms_mm(x, w):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=1e-6) @ w


def search(g, config, **options):
    return SearchResults([SearchResult(rmsnorm_linear(g), 0, 1e-6, 0.0, 2, 0.0, 0.0)],
                         SearchStats())


if __name__ == "__main__":
    x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    for launch in ("op", "inductor"):
        torch._dynamo.reset()
        b = Backend(cache_dir=tempfile.mkdtemp(), workers=1, search=search, profile=True,
                    rest="inductor", timing="both", launch=launch)
        with torch.no_grad():
            torch.compile(rms_mm, backend=b, dynamic=False)(x, w)
        print(f"launch={launch}:", b.reports[0].pieces[0].line())
