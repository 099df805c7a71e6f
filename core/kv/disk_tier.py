"""The disk offload tier: prefix blocks written to files in a worker's own folder, size-bounded.

One file per block, named by its chained hash (`<hex>.kvb`): a header (magic, the hash, the
payload's size and its BLAKE2b digest) and the block's bytes in the pool's layout. Writes happen
on a thread of the tier's own, off the engine thread: a block to write waits in `_pending`
(readable meanwhile) and lands under a temporary name that `os.replace` renames, so a crash
leaves a whole file or a `.tmp` one, never a torn file under a block's name. Still, nothing on
disk is trusted: at start every file's header is checked (magic, hash against its name, size)
and the bad ones deleted, and every read checks the payload's digest; a block that fails is
deleted and reported missing, never served. Files leave least recently used first once the tier
holds `capacity_blocks`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from pdserve.core.kv.block_pool import BlockHash

log = logging.getLogger(__name__)

MAGIC = b"PDKVBLK1"
HEADER = struct.Struct("<8s16sQ16s")  # magic, block hash, payload bytes, payload digest
SUFFIX = ".kvb"
# Blocks waiting for the writer at most; past it a demotion is dropped (counted), so a slow disk
# costs cache hits, never memory without bound.
MAX_PENDING = 256


@dataclass(frozen=True)
class BlockShape:
    """What one block is in memory: every file of a tier holds one of these."""

    shape: tuple[int, ...]  # [layers, 2, block_size, heads, row]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


@dataclass
class DiskStats:
    written_blocks: int = 0
    write_seconds: float = 0.0
    read_blocks: int = 0
    read_seconds: float = 0.0
    dropped_bad: int = 0  # files that failed a check (at start or on read): deleted
    dropped_backlog: int = 0  # demotions the writer had no room for


class DiskTier:
    def __init__(self, folder: Path, capacity_blocks: int, block: BlockShape) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks: must be >= 1, got {capacity_blocks}")
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.capacity_blocks = capacity_blocks
        self.block = block
        self.stats = DiskStats()
        self._lock = threading.Lock()  # guards _files, _pending and stats
        self._files: OrderedDict[BlockHash, None] = OrderedDict()  # least recently used first
        self._pending: dict[BlockHash, torch.Tensor] = {}
        self._queue: queue.SimpleQueue[BlockHash | None] = queue.SimpleQueue()
        self._adopt_existing()
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._writer.start()

    @property
    def num_used(self) -> int:
        with self._lock:
            return len(self._files) + len(self._pending)

    def __contains__(self, block_hash: BlockHash) -> bool:
        with self._lock:
            return block_hash in self._files or block_hash in self._pending

    def store(self, block_hash: BlockHash, block: torch.Tensor) -> None:
        """Queues `block` (a tensor nobody else writes) to be written; returns at once."""
        with self._lock:
            if block_hash in self._files or block_hash in self._pending:
                return
            if len(self._pending) >= MAX_PENDING:
                self.stats.dropped_backlog += 1
                return
            self._pending[block_hash] = block
        self._queue.put(block_hash)

    def load(self, block_hash: BlockHash) -> torch.Tensor | None:
        """The block, read and checked (most recently used now), or None: not held, or its file
        failed a check (then deleted)."""
        with self._lock:
            pending = self._pending.get(block_hash)
            if pending is not None:
                return pending
            if block_hash not in self._files:
                return None
            self._files.move_to_end(block_hash)
        start = time.perf_counter()
        block = self._read(block_hash)
        with self._lock:
            if block is None:
                self.stats.dropped_bad += 1
                self._files.pop(block_hash, None)
            else:
                self.stats.read_blocks += 1
                self.stats.read_seconds += time.perf_counter() - start
        return block

    def close(self) -> None:
        """Writes what is queued, then stops the writer."""
        self._queue.put(None)
        self._writer.join()

    # -- files --------------------------------------------------------------------------------

    def _path(self, block_hash: BlockHash) -> Path:
        return self.folder / (block_hash.hex() + SUFFIX)

    def _adopt_existing(self) -> None:
        """Takes over the blocks a previous worker left here whose header checks out, oldest
        first; deletes the rest (temporary files, torn or foreign ones)."""
        for leftover in self.folder.glob("*.tmp"):
            leftover.unlink(missing_ok=True)
        found = sorted(self.folder.glob("*" + SUFFIX), key=lambda path: path.stat().st_mtime)
        for path in found:
            block_hash = self._checked_header(path)
            if block_hash is None:
                self.stats.dropped_bad += 1
                path.unlink(missing_ok=True)
            else:
                self._files[block_hash] = None
        self._evict_past_capacity()
        if found:
            log.info("KV disk tier %s: reusing %d blocks", self.folder, len(self._files))

    def _checked_header(self, path: Path) -> BlockHash | None:
        """The block hash in the file's header when magic, name and size agree with it."""
        try:
            if path.stat().st_size != HEADER.size + self.block.nbytes:
                return None
            with path.open("rb") as file:
                magic, block_hash, size, _ = HEADER.unpack(file.read(HEADER.size))
        except (OSError, struct.error):
            return None
        good = (
            magic == MAGIC and size == self.block.nbytes and path.name == block_hash.hex() + SUFFIX
        )
        return block_hash if good else None

    def _read(self, block_hash: BlockHash) -> torch.Tensor | None:
        try:
            data = self._path(block_hash).read_bytes()
        except OSError:
            return None
        if len(data) != HEADER.size + self.block.nbytes:
            return None
        magic, stored_hash, size, digest = HEADER.unpack_from(data)
        payload = memoryview(data)[HEADER.size :]
        header_good = (magic, stored_hash, size) == (MAGIC, block_hash, self.block.nbytes)
        if not header_good or digest != _digest(payload):
            self._path(block_hash).unlink(missing_ok=True)
            return None
        flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        return flat.view(self.block.dtype).reshape(self.block.shape)

    def _write_loop(self) -> None:
        while (block_hash := self._queue.get()) is not None:
            with self._lock:
                block = self._pending[block_hash]
            start = time.perf_counter()
            try:
                self._write(block_hash, block)
            except OSError as error:  # a full or broken disk costs cache hits, nothing else
                log.warning("KV disk tier: writing a block failed: %s", error)
                with self._lock:
                    del self._pending[block_hash]
                continue
            with self._lock:
                del self._pending[block_hash]
                self._files[block_hash] = None
                self.stats.written_blocks += 1
                self.stats.write_seconds += time.perf_counter() - start
            self._evict_past_capacity()

    def _write(self, block_hash: BlockHash, block: torch.Tensor) -> None:
        payload = block.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
        header = HEADER.pack(MAGIC, block_hash, len(payload), _digest(payload))
        path = self._path(block_hash)
        temporary = path.with_suffix(".tmp")
        with temporary.open("wb") as file:
            file.write(header)
            file.write(payload)
        os.replace(temporary, path)

    def _evict_past_capacity(self) -> None:
        while True:
            with self._lock:
                if len(self._files) <= self.capacity_blocks:
                    return
                block_hash, _ = self._files.popitem(last=False)
            self._path(block_hash).unlink(missing_ok=True)


def _digest(payload: bytes | memoryview) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()
