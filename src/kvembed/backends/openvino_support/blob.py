"""A compiled OpenVINO blob as the session reads it: where the compiled model starts after the
header OpenVINO's ``CACHE_DIR`` writes (:func:`payload_offset`), and a memory-mapped blob's pages
released while OpenVINO reads it (:func:`release_pages`, :func:`pages_released_meanwhile`).

Kept apart from the session (:mod:`kvembed.backends.openvino`) and the cache
(:mod:`.compiled_cache`) because it is about the bytes of one blob and the kernel's pages, not
about where blobs are kept or how a model is compiled; it needs neither OpenVINO nor the rest of kvembed."""

from __future__ import annotations

import contextlib
import mmap
import re
import sys
import threading
from typing import Iterator

#: OpenVINO's ``CACHE_DIR`` blobs begin with one XML header line before what ``export_model()`` writes
_HEADER = re.compile(rb"<\?xml[^\n]*?<compiled_blob[^\n]*?/>\n")
_ALIGNMENT = re.compile(rb'header_size_alignment="(\d+)"')


def payload_offset(blob: bytes | mmap.mmap) -> int:
    """Where the compiled model starts in ``blob``: after the header line OpenVINO's ``CACHE_DIR``
    writes, which OpenVINO pads with zeros to a multiple of its ``header_size_alignment`` where that
    is not 0 (``CompiledBlobHeader``'s writer); 0 for a blob without the header (``export_model()``)."""
    head = bytes(blob[:4096])
    match = _HEADER.match(head)
    if match is None:
        return 0
    alignment = _ALIGNMENT.search(match.group(0))
    step = int(alignment.group(1)) if alignment else 0
    end = match.end()
    return -(-end // step) * step if step > 1 else end


#: Linux's MADV_PAGEOUT (5.4+; Python 3.11's mmap module does not name it)
MADV_PAGEOUT = getattr(mmap, "MADV_PAGEOUT", 21 if sys.platform.startswith("linux") else None)


def release_pages(mapped: mmap.mmap) -> bool:
    """Ask the kernel to reclaim ``mapped``'s resident pages; True when it accepted.

    Importing a blob reads every constant once, and the CPU plugin keeps its own repacked copy of
    the matmul weights; the blob's pages stay resident (counted in RSS) though most are not read
    again. ``MADV_PAGEOUT`` only reclaims: a page still needed is read back from the file on its
    next touch, so this is safe whatever OpenVINO maps where; a later call reads back only the
    small part of the blob it touches."""
    if MADV_PAGEOUT is None or not hasattr(mapped, "madvise"):
        return False
    try:
        mapped.madvise(MADV_PAGEOUT)
    except OSError:  # EINVAL before Linux 5.4
        return False
    return True


@contextlib.contextmanager
def pages_released_meanwhile(mapped: mmap.mmap, interval: float = 0.05) -> Iterator[None]:
    """Release ``mapped``'s pages every ``interval`` seconds while the body runs, and once after.

    OpenVINO's import reads the whole blob (every constant, as f32) while it builds
    its own, smaller copy; released only at the end, both are resident at once and set the
    process's peak. Released as the import goes, the peak is the plugin's copy plus what was read
    in the last ``interval``."""
    done = threading.Event()

    def pager() -> None:
        while not done.wait(interval):
            release_pages(mapped)

    thread = threading.Thread(target=pager, name="kvembed-ov-pageout", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        release_pages(mapped)
