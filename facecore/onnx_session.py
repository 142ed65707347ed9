"""onnxruntime sessions that pay for graph optimisation once per model file, not once per process.

A cold `fedface device verify` builds its recognition session in every process, and onnxruntime's full
optimisation of the 22 MB dlib ResNet (above all the NCHWc layout pass, which reorders every conv
weight) costs several times what loading the optimised graph does.
So the first session of a model file saves its optimised graph, and later ones load that with
optimisation off: the same nodes and kernels, so the same outputs, bit for bit.

A saved graph is a folder of two files: the graph (GRAPH, a few KB) and its weights (WEIGHTS, every
initializer of at least EXTERNAL_MIN_BYTES), which onnxruntime maps into memory instead of parsing and
copying them, so a later session starts in a few milliseconds and shares the weights' pages with the
file cache.

Invariants:
- The saved graph is keyed by the source file's sha256, the onnxruntime version, the thread count and
  the CPU (its architecture and feature flags): the NCHWc pass lays weights out for this CPU's vector
  width, so a graph saved on one CPU may be wrong on another and must never be found there.
- It is written atomically: both files go into a private temporary folder, which is renamed into place,
  so a reader sees a whole saved graph or none. One that onnxruntime cannot load (a file missing, cut
  short or not a graph) is deleted and the session is built from the source instead; a cache folder that
  cannot be written only means no saving. Either way the caller gets a session.
- A saved graph is never written in place (only made whole and renamed, or deleted), so the weights a
  session maps stay what they were when it was made.
- Only files are cached, never ONNX bytes: those are the personal verifier's graph, which exists
  unencrypted only in memory (device_sdk.personal_file).
- The folder keeps the KEEP most recently used graphs; older ones, and graphs of an earlier format, are
  deleted when a new one is saved.
- Imports onnxruntime only when a session is made, never torch.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from facecore.digest import file_sha256
from facecore.paths import cache_root

if TYPE_CHECKING:
    import onnxruntime as ort

OPTIMIZED_DIR = "onnx-optimized"
GRAPH = "model.onnx"
WEIGHTS = "weights.bin"
# Smaller initializers (biases, shapes) stay in the graph: mapping them would cost more than it saves.
EXTERNAL_MIN_BYTES = 1024
# A device holds its model, the one it replaces, and the detectors' four nets (tinyface's one and MTCNN's three);
# at 8 an evaluation of a few models would push the detectors out and make them save their graphs again each run.
KEEP = 16
STALE_TEMP_S = 3600.0
# onnxruntime's ERROR: the save itself warns that an NCHWc graph is hardware specific, which the key handles.
QUIET = 3


def optimized_dir() -> Path:
    return cache_root() / OPTIMIZED_DIR


def cpu_key() -> str:
    """A short name for what the saved graph depends on in this CPU: its architecture and feature flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:  # the first processor's flags: the same on every core
                if line.startswith(("flags", "Features")):
                    flags = line
                    break
    except OSError:  # not Linux: the processor's name is what there is
        flags = platform.processor()
    return hashlib.sha256(f"{platform.machine()}|{flags}".encode()).hexdigest()[:12]


def session_options(threads: int = 1) -> ort.SessionOptions:
    """One intra-op thread pool of `threads`, no inter-op parallelism: the device's settings."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options


def open_session(model: str | Path | bytes, threads: int = 1, sha256: str | None = None,
                 cache: Path | None = None) -> ort.InferenceSession:
    """A CPU session of `model` (a file, or ONNX bytes, never cached) at full optimisation, loaded from
    the optimised graph saved by an earlier call when there is one. `sha256`: the file's, when the
    caller has just checked it (else it is computed); `cache`: the folder of saved graphs (default
    `optimized_dir()`)."""
    import onnxruntime as ort

    if isinstance(model, bytes):
        return ort.InferenceSession(model, session_options(threads), providers=["CPUExecutionProvider"])
    source = Path(model)
    folder = cache if cache is not None else optimized_dir()
    digest = sha256 or file_sha256(source)
    saved = folder / f"{digest[:32]}-ort{ort.__version__}-t{threads}-{cpu_key()}"
    if saved.is_dir():  # one without its graph is as damaged as one onnxruntime refuses
        session = _load_optimized(saved, threads)
        if session is not None:
            return session
    return _build_and_save(source, saved, threads)


def _load_optimized(saved: Path, threads: int) -> ort.InferenceSession | None:
    import onnxruntime as ort

    options = session_options(threads)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # it is optimised already
    try:
        session = ort.InferenceSession(str(saved / GRAPH), options, providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime's errors share no base class: any failure means a bad saved graph
        shutil.rmtree(saved, ignore_errors=True)
        return None
    with contextlib.suppress(OSError):
        os.utime(saved)  # the pruning's "recently used"
    return session


def _build_and_save(source: Path, saved: Path, threads: int) -> ort.InferenceSession:
    import onnxruntime as ort

    plain = session_options(threads)
    try:
        saved.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # as private as the state folder it serves
        temp = Path(tempfile.mkdtemp(dir=saved.parent, prefix=f".{saved.name}.", suffix=".tmp"))  # mode 0700
    except OSError:  # an unwritable cache: no saving
        return ort.InferenceSession(str(source), plain, providers=["CPUExecutionProvider"])
    try:
        options = session_options(threads)
        options.optimized_model_filepath = str(temp / GRAPH)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", WEIGHTS)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                         str(EXTERNAL_MIN_BYTES))
        options.log_severity_level = QUIET
        try:
            session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        except Exception:  # the saving failed (a full disk), or the source is bad, which this raises again
            return ort.InferenceSession(str(source), plain, providers=["CPUExecutionProvider"])
        try:
            if (temp / GRAPH).stat().st_size > 0:
                os.rename(temp, saved)  # refused when another process saved the same graph first: its copy stays
                _prune(saved.parent, KEEP)
        except OSError:  # the session is made; only the saving failed
            pass
        return session
    finally:
        shutil.rmtree(temp, ignore_errors=True)  # nothing left once renamed into place


def _prune(folder: Path, keep: int) -> None:
    now = time.time()
    try:
        graphs = sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")),
                        key=lambda p: p.stat().st_mtime, reverse=True)
        # A temporary folder an hour old belongs to a process that died while saving.
        stale = [p for p in folder.glob(".*.tmp") if now - p.stat().st_mtime > STALE_TEMP_S]
        earlier_format = list(folder.glob("*.onnx"))  # one file per graph, weights inside: never loaded now
        for old in [*graphs[keep:], *stale, *earlier_format]:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
    except OSError:  # another process pruned the same entry first
        pass


__all__ = ["GRAPH", "KEEP", "WEIGHTS", "cpu_key", "open_session", "optimized_dir", "session_options"]
