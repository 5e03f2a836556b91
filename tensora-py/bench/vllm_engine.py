"""One vLLM engine start in this process, for the vLLM end-to-end test and bench (run in the vLLM
venv, target/vllm-venv, one fresh process per start).

    python vllm_engine.py MODEL_DIR --load-format tensora [--extra JSON] [--generate]
        [--digests] --out RESULT.json

Starts ``vllm.LLM`` on vLLM's CPU build (in-process engine, eager, no tokenizer: prompts are
token ids), and writes JSON: ``ok``; ``start_seconds`` (the whole ``LLM()``);
``loading_weights_seconds`` (vLLM's own "Loading weights took" figure, ``None`` for a loader
that logs none); ``load_weights_seconds`` (the loader's ``load_weights``, timed here); with ``--generate`` the
greedy ``token_ids`` and ``logprobs`` of fixed prompts; with ``--digests`` the SHA-256 of every
model parameter's bytes (``llm.apply_model``). An engine that refuses to start writes ``ok:
false`` and the error's type and message, and exits 3.
"""

import argparse
import hashlib
import json
import os
import sys
import time

# Fixed prompts (token ids below every vocabulary the tests and the bench use) and lengths.
PROMPTS = [[1, 450, 4996, 17354, 1701, 29916], [1, 3681, 338, 263], [1, 29871, 13, 2, 7, 99, 100, 1000]]
NEW_TOKENS = 12
TOP_LOGPROBS = 5
# The KV cache vLLM's CPU backend may take, in GiB: the prompts need a few MiB.
KV_CACHE_GIB = 1
# The exit code of an engine that refused to start (the error is in the JSON).
REFUSED_EXIT = 3


def _env() -> None:
    # Before vLLM is imported: its settings are read at import.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GIB))
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def digests(model) -> dict:
    """SHA-256 of every parameter's bytes, by name."""
    import torch

    out = {}
    for name, p in model.named_parameters():
        t = p.detach().cpu().contiguous().view(-1).view(torch.uint8)
        out[name] = hashlib.sha256(t.numpy().tobytes()).hexdigest()
    return out


def time_load_weights(into: dict) -> None:
    """Time every ``load_weights`` of vLLM's loaders (``into["load_weights_seconds"]``): the same
    span for every load format. For ``DefaultModelLoader`` (and so ``tensora``) also the figure
    of its "Loading weights took" line, from the two counters it is printed from
    (``into["loading_weights_seconds"]``, unrounded); Run:ai's loader logs none."""
    from vllm.model_executor.model_loader import DefaultModelLoader, RunaiModelStreamerLoader

    for cls in (DefaultModelLoader, RunaiModelStreamerLoader):
        inner = cls.load_weights

        def timed(self, model, model_config, _inner=inner):
            t = time.perf_counter()
            try:
                return _inner(self, model, model_config)
            finally:
                into["load_weights_seconds"] = time.perf_counter() - t
                after = getattr(self, "counter_after_loading_weights", 0.0)
                if after:
                    into["loading_weights_seconds"] = after - self.counter_before_loading_weights

        cls.load_weights = timed


def start(model_dir: str, load_format: str, extra: dict):
    from vllm import LLM

    return LLM(
        model=model_dir,
        load_format=load_format,
        model_loader_extra_config=extra,
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=4,
        seed=0,
    )


def generate(llm) -> dict:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=TOP_LOGPROBS, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    token_ids, logprobs = [], []
    for o in outs:
        c = o.outputs[0]
        token_ids.append(list(c.token_ids))
        logprobs.append([{str(t): lp.logprob for t, lp in sorted(step.items())} for step in c.logprobs])
    return {"token_ids": token_ids, "logprobs": logprobs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--load-format", required=True)
    ap.add_argument("--extra", default="{}", help="model_loader_extra_config as JSON")
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--digests", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    _env()
    result = {"load_format": a.load_format}
    time_load_weights(result)
    t0 = time.perf_counter()
    try:
        llm = start(a.model_dir, a.load_format, json.loads(a.extra))
    except Exception as e:  # the engine refused to start: the test checks why
        result.update(ok=False, error_type=type(e).__name__, error=str(e), chain=_chain(e))
        _write(a.out, result)
        return REFUSED_EXIT
    result.update(ok=True, start_seconds=time.perf_counter() - t0)
    if a.generate:
        result.update(generate(llm))
    if a.digests:
        result["digests"] = llm.apply_model(digests)[0]
    _write(a.out, result)
    return 0


def _chain(e: BaseException) -> list:
    """The messages of an exception and its causes (vLLM may wrap the loader's error)."""
    out = []
    while e is not None and len(out) < 8:
        out.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return out


def _write(path: str, result: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
