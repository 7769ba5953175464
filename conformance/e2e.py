"""The engine end to end: vLLM's CPU speculative decoding, run with each kernel set.

Runs inside a venv that holds a real vLLM for CPUs and specdiff (``nox -s e2e`` makes it; vLLM never
enters specdiff's own environment). A tiny Llama target and a one-layer draft that shares its
embedding, first layer and head are built here from a fixed seed (a tokenizer trained with
``tokenizers`` on generated text, random weights): nothing is downloaded.

The plugin registers every kernel set and one engine per method switches between them, in rounds
whose order rotates (so that tokens/s compare under the same load):

- ``engine``: vLLM's own CPU port (the plugin only counts and records its launches);
- ``cpu``: specdiff's C++ port;
- ``reference``: specdiff's oracle.

Checks: at temperature 0 every method and kernel set gives, token for token, what the same prompts
give without speculative decoding (the engine's own invariant); at temperature 1 with a seed, the
port and the oracle give identical tokens, and the engine's port is compared with them; each run's
acceptance rate, tokens/s, the spec-decode kernels' share of the run, and the mean log-probability
per sampled token under the target (computed with transformers, outside vLLM) side by side. The
plugin must be verifiably active: its sets count their launches.

    python -m conformance.e2e [--methods ngram,draft_model] [--record DIR] [--out reports/e2e.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

METHODS = ("ngram", "draft_model")
KERNEL_SETS = ("engine", "cpu", "reference")
LABELS = {"engine": "vLLM's CPU port", "cpu": "specdiff's port", "reference": "specdiff's oracle"}
SEED = 0
VOCAB = 512
WORDS = 400


def _words(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(WORDS)]


def build_models(root: Path, seed: int = SEED) -> tuple[Path, Path]:
    """A two-layer Llama target and a one-layer draft (the target's embedding, first layer, norm and
    head) under ``root``, from ``seed``; built once, reused when present."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    target, draft = root / "target", root / "draft"
    if (target / "config.json").exists() and (draft / "config.json").exists():
        return target, draft
    rng = random.Random(seed)
    words = _words(rng)
    corpus = [" ".join(rng.choice(words) for _ in range(24)) for _ in range(2000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    vocab = len(fast)

    def config(layers: int) -> Any:
        return LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                           num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                           bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="float32")

    torch.manual_seed(seed)
    big = LlamaForCausalLM(config(2)).float()
    with torch.no_grad():
        for p in big.parameters():
            p.normal_(0.0, 0.08)
        big.lm_head.weight.mul_(4.0)  # peaked distributions: sampling at temperature 1 is not noise
        for norm in [big.model.norm] + [m for layer in big.model.layers for m in (layer.input_layernorm, layer.post_attention_layernorm)]:
            norm.weight.fill_(1.0)
        # The second layer a perturbation: the draft (first layer only) mostly, not always, agrees.
        big.model.layers[1].self_attn.o_proj.weight.mul_(0.3)
        big.model.layers[1].mlp.down_proj.weight.mul_(0.3)
    small = LlamaForCausalLM(config(1)).float()
    state = {k: v for k, v in big.state_dict().items() if not k.startswith("model.layers.1.")}
    small.load_state_dict(state)
    for path, model in ((target, big), (draft, small)):
        model.save_pretrained(path, safe_serialization=True)
        fast.save_pretrained(path)
    return target, draft


def prompts(count: int, seed: int = SEED) -> list[str]:
    """Prompts of the tokenizer's words, some with repeated phrases (what ngram drafts from)."""
    rng = random.Random(seed + 1)
    words = _words(random.Random(seed))
    out = []
    for i in range(count):
        phrase = " ".join(rng.choice(words) for _ in range(rng.randint(2, 5)))
        filler = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        out.append(f"{phrase} {filler} {phrase}" if i % 2 == 0 else f"{filler} {phrase} {filler}")
    return out


def speculative_config(method: str, draft: Path, k: int) -> dict[str, Any] | None:
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    if method == "draft_model":
        return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}
    raise ValueError(f"method must be one of none, {', '.join(METHODS)}, got {method!r}")


def _counter(metrics: list[Any], name: str) -> int:
    return sum(int(getattr(m, "value", 0)) for m in metrics if m.name == name)


class Engine:
    """One vLLM engine (one method) in this process; :meth:`generate` runs the prompts with the kernel
    set made active through the plugin and measures the call."""

    def __init__(self, target: Path, draft: Path, method: str, k: int) -> None:
        from vllm import LLM

        self.method = method
        self.llm = LLM(model=str(target), tokenizer=str(target), speculative_config=speculative_config(method, draft, k),
                       dtype="float32", seed=SEED, max_model_len=256, max_num_seqs=8, enforce_eager=True,
                       disable_log_stats=False, gpu_memory_utilization=0.15)

    def generate(self, kernels: str, texts: list[str], tokens: int, temperature: float, seeds: int) -> dict[str, Any]:
        from vllm import SamplingParams

        from conformance import vllm_plugin

        vllm_plugin.use(kernels)
        params = [SamplingParams(temperature=temperature, max_tokens=tokens, ignore_eos=True,
                                 seed=None if temperature == 0 else 1000 + (i % seeds)) for i in range(len(texts))]
        before = self.llm.get_metrics()
        launches, kernel_seconds = sum(vllm_plugin.LAUNCHES.values()), vllm_plugin.SECONDS[0]
        start = time.perf_counter()
        outs = self.llm.generate(texts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        after = self.llm.get_metrics()
        drafted, accepted = (_counter(after, n) - _counter(before, n) for n in
                             ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"))
        return {"tokens": [list(o.outputs[0].token_ids) for o in outs], "prompt_tokens": [list(o.prompt_token_ids) for o in outs],
                "seconds": elapsed, "drafted": drafted, "accepted": accepted,
                "launches": sum(vllm_plugin.LAUNCHES.values()) - launches, "kernel_seconds": vllm_plugin.SECONDS[0] - kernel_seconds}

    def close(self) -> None:
        del self.llm
        gc.collect()


def run_method(target: Path, draft: Path, method: str, texts: list[str], tokens: int, k: int, seeds: int,
               rounds: int) -> dict[str, Any]:
    """One method with every kernel set, interleaved in rounds (the sets' order rotates each round), at
    temperatures 0 and 1 (``none``: vLLM's kernels alone, one round). One engine per process: vLLM 0.32.0
    cannot build a second engine in a process that ran one (its kernel registry's rebinding scan fails)."""
    runs: dict[str, Any] = {}
    engine = Engine(target, draft, method, k)
    sets = KERNEL_SETS if method != "none" else ("engine",)
    for kernels in sets:  # a warm-up each: first launches build caches
        engine.generate(kernels, texts[:2], 4, 1.0, seeds)
    for r in range(rounds if method != "none" else 1):
        for kernels in sets[r % len(sets):] + sets[:r % len(sets)]:
            for temperature in (0.0, 1.0):
                key = f"{method}@{temperature:g}" if method == "none" else f"{method}/{kernels}@{temperature:g}"
                runs.setdefault(key, []).append(engine.generate(kernels, texts, tokens, temperature, seeds))
    from conformance import vllm_plugin

    return {"runs": runs, "launches_by_kernel": dict(vllm_plugin.LAUNCHES)}


def mean_logprob(target: Path, prompt_ids: list[list[int]], out_ids: list[list[int]]) -> float:
    """The mean log-probability per sampled token under the target, computed by transformers."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for p, o in zip(prompt_ids, out_ids):
            ids = torch.tensor([p + o])
            logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
            for j, t in enumerate(o):
                total += float(logp[len(p) + j - 1, t])
                count += 1
    return total / count if count else math.nan


def _differ(a: list[list[int]], b: list[list[int]]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


def compare(runs: dict[str, Any], methods: list[str], target: Path) -> dict[str, Any]:
    """The checks and the side-by-side table from every run (each key a list of rounds)."""
    checks: list[dict[str, Any]] = []
    table: list[dict[str, Any]] = []

    def row(method: str, kernels: str, temperature: float, rounds: list[dict[str, Any]]) -> None:
        seconds = sum(r["seconds"] for r in rounds)
        drafted, accepted = sum(r["drafted"] for r in rounds), sum(r["accepted"] for r in rounds)
        entry = {"method": method, "kernels": kernels, "temperature": temperature,
                 "tokens_per_s": sum(len(t) for r in rounds for t in r["tokens"]) / seconds if seconds else 0.0,
                 "acceptance": accepted / drafted if drafted else None, "drafted": drafted, "accepted": accepted,
                 "launches": sum(r["launches"] for r in rounds), "kernel_share": sum(r["kernel_seconds"] for r in rounds) / seconds,
                 "reproducible": all(r["tokens"] == rounds[0]["tokens"] for r in rounds) if len(rounds) > 1 else None}
        if temperature:
            entry["mean_logprob"] = mean_logprob(target, rounds[0]["prompt_tokens"], rounds[0]["tokens"])
        table.append(entry)

    for temperature in (0.0, 1.0):
        row("none", "engine", temperature, runs[f"none@{temperature:g}"])
    want = runs["none@0"][0]["tokens"]
    for method in methods:
        for kernels in KERNEL_SETS:
            for temperature in (0.0, 1.0):
                row(method, kernels, temperature, runs[f"{method}/{kernels}@{temperature:g}"])
            for r, got in enumerate(runs[f"{method}/{kernels}@0"]):
                differ = _differ(got["tokens"], want)
                checks.append({"check": f"greedy {method} with {LABELS[kernels]} (round {r + 1}) equals no speculation",
                               "ok": not differ, "differing_prompts": differ})
            if kernels != "engine":
                launched = sum(r["launches"] for r in runs[f"{method}/{kernels}@0"])
                checks.append({"check": f"the plugin launched {LABELS[kernels]} for {method}", "ok": launched > 0, "launches": launched})
        oracle = runs[f"{method}/reference@1"]
        for r, ours in enumerate(runs[f"{method}/cpu@1"]):
            differ = _differ(ours["tokens"], oracle[r]["tokens"])
            checks.append({"check": f"temperature 1 {method} (round {r + 1}): specdiff's port equals its oracle",
                           "ok": not differ, "differing_prompts": differ})
        for r, theirs in enumerate(runs[f"{method}/engine@1"]):
            differ = _differ(theirs["tokens"], oracle[r]["tokens"])
            checks.append({"check": f"temperature 1 {method} (round {r + 1}): vLLM's port against specdiff's oracle",
                           "ok": None, "differing_prompts": differ, "of": len(oracle[r]["tokens"])})
    return {"checks": checks, "table": table}


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated: ngram, draft_model")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per prompt")
    parser.add_argument("-k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--seeds", type=int, default=4, help="distinct sampling seeds over the prompts")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every kernel set")
    parser.add_argument("--models", default="reports/e2e-models", help="where the tiny models are built")
    parser.add_argument("--record", default="", help="a directory: every kernel set's launches saved as cases")
    parser.add_argument("--out", default="reports/e2e.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one method's engine, in a process of its own
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    for m in methods:
        speculative_config(m, Path(), 1)  # an unknown method fails here, naming it
    for name in ("prompts", "tokens", "k", "seeds", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    # Before vLLM loads: the engine in this process (so the plugin's counters are this process's),
    # only specdiff's plugin, nothing from a hub.
    os.environ.update({"VLLM_PLUGINS": "specdiff", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
                       "TRANSFORMERS_OFFLINE": "1", "SPECDIFF_PLUGIN_KERNELS": "engine"})
    if args.record:
        os.environ["SPECDIFF_RECORD"] = args.record
    target, draft = build_models(Path(args.models))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.child:
        result = run_method(target, draft, args.child, prompts(args.prompts), args.tokens, args.k, args.seeds, args.rounds)
        Path(args.out).write_text(json.dumps(result))
        return 0
    start = time.perf_counter()
    runs: dict[str, Any] = {}
    launches: dict[str, dict[str, int]] = {}
    for method in ["none", *methods]:
        out = Path(args.out).with_name(f"e2e-{method}.json")
        cmd = [sys.executable, "-m", "conformance.e2e", *(argv if argv is not None else sys.argv[1:]), "--child", method,
               "--out", str(out)]
        began = time.perf_counter()
        if subprocess.run(cmd).returncode != 0:
            print(f"e2e: the engine run of method {method} failed (its output is above)", file=sys.stderr)
            return 1
        print(f"e2e: {method} took {time.perf_counter() - began:.0f} s", flush=True)
        result = json.loads(out.read_text())
        runs.update(result["runs"])
        launches[method] = result["launches_by_kernel"]
    report = compare(runs, methods, target)
    report["launches_by_kernel"] = launches
    report["settings"] = {k: getattr(args, k) for k in ("prompts", "tokens", "k", "seeds", "rounds")} | {"methods": methods}
    report["seconds"] = time.perf_counter() - start
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"\n{'method':<12} {'kernels':<10} {'T':>3} {'tok/s':>8} {'accept':>7} {'launches':>8} {'kernel %':>8} {'logp/tok':>9} {'same seeds, same tokens':>24}")
    for r in report["table"]:
        print(f"{r['method']:<12} {r['kernels']:<10} {r['temperature']:>3g} {r['tokens_per_s']:>8.1f} "
              f"{_fmt(r['acceptance'], '.3f'):>7} {r['launches']:>8d} {100 * r['kernel_share']:>8.1f} "
              f"{_fmt(r.get('mean_logprob'), '.3f'):>9} { {True: 'yes', False: 'NO', None: '-'}[r['reproducible']]:>24}")
    failed = 0
    for c in report["checks"]:
        status = "info" if c["ok"] is None else "ok" if c["ok"] else "FAIL"
        failed += c["ok"] is False
        extra = f" (differs on prompts {c['differing_prompts']})" if c.get("differing_prompts") else ""
        print(f"{status:<5} {c['check']}{extra}")
    print(f"e2e: wrote {args.out} ({report['seconds']:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
