"""Radix prefix caches of one KV pool, with an optional host tier (HiCache).

Two implementations behind one interface, used by the same scheduler (``tuner.sim.engine``):

* ``SessionPrefixCache`` (offline simulator): every prompt of a session extends the previous one
  and every session starts with the workload's shared system prefix, so the radix tree of a pool
  is one shared system-prefix node with one branch per session, and the cache only needs how many
  tokens of each session's conversation are cached.
* ``ContentPrefixCache`` (``tuner serve-sim``): prompts are arbitrary token lists, so blocks of
  tokens are identified by the hash chain of their content.

Both follow SGLang's ``RadixCache`` (srt/mem_cache/radix_cache.py): matches are page-aligned and
leave at least one token to compute (``Req._compute_max_prefix_len``); eviction frees the least
recently used unlocked leaves first (``RadixCache.evict`` with ``LRUStrategy``), so a session
loses its conversation from the tail; a request's matched prefix is locked while it runs
(``inc_lock_ref``). The shared system prefix is touched by every request and is never the LRU leaf
while any branch exists; it is kept.

With HiCache (``HiRadixCache``, write-through: ``write_through_threshold`` 1), every inserted
block is also written to the host pool, device eviction drops only the device copy
(``_evict_write_through``), the host pool evicts host-only blocks LRU when full (``evict_host``),
and a match reports ``device`` tokens plus ``host`` more to load back.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict


class _PrefixCache:
    """What both caches share: the pool's free tokens and making room by eviction. Subclasses keep
    ``capacity``, ``tree_tokens``, ``alloc_tokens`` and ``evictable`` and implement ``evict``."""

    capacity: int
    tree_tokens: int
    alloc_tokens: int
    evictable: int

    def free(self) -> int:
        return self.capacity - self.tree_tokens - self.alloc_tokens

    def evict(self, tokens: int) -> int:
        raise NotImplementedError

    def ensure_free(self, tokens: int) -> bool:
        """Evict until ``tokens`` are free; False when even evicting everything is not enough."""
        short = tokens - self.free()
        if short <= 0:
            return True
        if short > self.evictable:
            return False
        self.evict(short)
        return self.free() >= tokens


class SessionPrefixCache(_PrefixCache):
    def __init__(self, capacity_tokens: int, page_size: int, system_prefix_tokens: int,
                 host_capacity_tokens: int = 0):
        self.capacity = capacity_tokens
        self.page = max(1, page_size)
        self.sys_len = system_prefix_tokens // self.page * self.page
        self.sys_cached = False
        self.branch: dict[int, int] = {}  # session -> cached tokens after the system prefix
        self.lru: OrderedDict[int, None] = OrderedDict()  # unlocked sessions, oldest first
        self.locked: set[int] = set()
        self.tree_tokens = 0  # tokens held by the tree (incl. locked branches)
        self.branch_evictable = 0  # tokens of unlocked branches
        self.alloc_tokens = 0  # tokens held by running requests outside the tree
        self.host_capacity = host_capacity_tokens
        self.host_sys = False  # the system prefix has a host copy
        self.host: dict[int, int] = {}
        self.host_lru: OrderedDict[int, None] = OrderedDict()
        self.host_used = 0
        self.host_written = 0  # tokens ever copied to the host pool (write-through backups)
        self.evicted_tokens = 0

    # ---- queries ---------------------------------------------------------------------------
    @property
    def evictable(self) -> int:
        """Unlocked device tokens (``evictable_size``): the unlocked branches, plus the shared
        system prefix while no request holds it."""
        if self.sys_cached and not self.locked:
            return self.branch_evictable + self.sys_len
        return self.branch_evictable

    def match(self, req) -> tuple[int, int]:
        """(tokens on the device, tokens more on the host) of the request's cached prefix."""
        session = req.session
        limit = (req.prefill_len - 1) // self.page * self.page  # at least one token is always computed
        dev = min(self.sys_len + self.branch.get(session, 0), limit) if self.sys_cached else 0
        host = 0
        if self.host_capacity and self.host_sys:
            host = max(0, min(self.sys_len + self.host.get(session, 0), limit) - dev)
        return dev, host

    # ---- state changes ---------------------------------------------------------------------
    def lock(self, req) -> None:
        session = req.session
        if session in self.lru:
            del self.lru[session]
            self.branch_evictable -= self.branch.get(session, 0)
        self.locked.add(session)

    def unlock(self, req) -> None:
        session = req.session
        if session in self.locked:
            self.locked.discard(session)
            if self.branch.get(session, 0):
                self.lru[session] = None
                self.branch_evictable += self.branch[session]

    def evict(self, tokens: int) -> int:
        """Free at least ``tokens`` (LRU unlocked branches, tail first, then the system prefix
        once it is the last unlocked leaf); returns tokens freed."""
        freed = 0
        while freed < tokens and self.lru:
            session = next(iter(self.lru))
            have = self.branch[session]
            take = min(have, -(-(tokens - freed) // self.page) * self.page)
            left = have - take
            if left <= 0:
                del self.lru[session]
                del self.branch[session]
            else:
                self.branch[session] = left
            freed += take
            self.tree_tokens -= take
            self.branch_evictable -= take
        if freed < tokens and self.sys_cached and not self.locked and not self.branch:
            self.sys_cached = False
            self.tree_tokens -= self.sys_len
            freed += self.sys_len
        self.evicted_tokens += freed
        return freed

    def load_back(self, req, tokens: int) -> bool:
        """Bring ``tokens`` host tokens following the device match back to the device (locked by
        the request, which must hold the lock); False when the device cannot make room."""
        if not self.ensure_free(tokens):
            return False
        if not self.sys_cached:
            self.sys_cached = True
            self.tree_tokens += self.sys_len
            tokens -= self.sys_len
        session = req.session
        self.branch[session] = self.branch.get(session, 0) + tokens
        self.tree_tokens += tokens
        return True

    def insert(self, req, total_len: int) -> int:
        """Cache the first ``total_len`` tokens of the request's sequence, page-aligned. The
        request holds the lock. Returns the tokens of the sequence the tree now covers (the
        caller keeps the rest of its tokens allocated to the request, or frees them)."""
        session = req.session
        aligned = total_len // self.page * self.page
        if not self.sys_cached and aligned >= self.sys_len:
            self.sys_cached = True
            self.tree_tokens += self.sys_len
        new_branch = max(0, aligned - self.sys_len) if self.sys_cached else 0
        old = self.branch.get(session, 0)
        if new_branch > old:
            self.branch[session] = new_branch
            self.tree_tokens += new_branch - old
            if session not in self.locked:  # only happens for a request that never locked
                self.branch_evictable += new_branch - old
                self.lru[session] = None
                self.lru.move_to_end(session)
        if self.host_capacity and self.sys_cached:
            if not self.host_sys:
                self.host_sys = True
                self.host_written += self.sys_len
            self._host_insert(session, new_branch)
        return min(aligned, self.sys_len + self.branch.get(session, 0)) if self.sys_cached else 0

    def _host_insert(self, session: int, length: int) -> None:
        old = self.host.get(session, 0)
        if length > old:
            self.host[session] = length
            self.host_used += length - old
            self.host_written += length - old
        if session in self.host_lru:
            self.host_lru.move_to_end(session)
        else:
            self.host_lru[session] = None
        # host pool full: drop host-only tails (tokens no longer on the device), oldest first
        over = self.host_used + self.sys_len - self.host_capacity
        if over > 0:
            for victim in list(self.host_lru):
                if over <= 0:
                    break
                if victim == session:
                    continue
                droppable = self.host[victim] - self.branch.get(victim, 0)
                if droppable <= 0:
                    continue
                take = min(droppable, over)
                self.host[victim] -= take
                self.host_used -= take
                over -= take
                if self.host[victim] == 0:
                    del self.host[victim]
                    del self.host_lru[victim]


class _Block:
    __slots__ = ("parent", "children", "dev_children", "lock", "last_access", "on_device", "on_host")

    def __init__(self, parent: int):
        self.parent = parent
        self.children = 0  # child blocks (device or host)
        self.dev_children = 0  # child blocks on the device
        self.lock = 0
        self.last_access = 0
        self.on_device = True
        self.on_host = False


class ContentPrefixCache(_PrefixCache):
    """Content-addressed radix cache: blocks of ``block`` tokens keyed by the hash chain of the
    tokens so far. ``block`` is the page size, or 16 tokens when pages are smaller (matches are
    then rounded down to 16 tokens: at most 15 tokens less than SGLang would match).

    Requests carry ``tokens`` (their sequence so far), ``chain`` (block hashes, extended lazily)
    and ``lock_len`` (how many leading blocks they hold locked)."""

    def __init__(self, capacity_tokens: int, page_size: int, host_capacity_tokens: int = 0,
                 block_tokens: int = 16):
        self.capacity = capacity_tokens
        self.page = max(1, page_size)
        self.block = max(self.page, block_tokens)
        self.blocks: dict[int, _Block] = {}
        self.tree_tokens = 0  # device tokens held by the tree
        self.evictable = 0  # device tokens of unlocked blocks
        self.alloc_tokens = 0
        self.host_capacity = host_capacity_tokens
        self.host_used = 0
        self.host_written = 0  # tokens ever copied to the host pool (write-through backups)
        self.evicted_tokens = 0
        self._tick = 0
        self._leaves: list[tuple[int, int]] = []  # (last_access, hash) of device leaves, lazily validated
        self._host_leaves: list[tuple[int, int]] = []  # host-only leaves

    @staticmethod
    def chain(tokens, block: int) -> list[int]:
        out, h = [], 0
        for i in range(0, len(tokens) - len(tokens) % block, block):
            h = hash((h, tuple(tokens[i:i + block])))
            out.append(h)
        return out

    def _req_chain(self, req, length: int) -> list[int]:
        n = length // self.block
        chain = req.chain
        if len(chain) < n:
            h = chain[-1] if chain else 0
            toks = req.tokens
            for i in range(len(chain) * self.block, min(n, len(toks) // self.block) * self.block, self.block):
                h = hash((h, tuple(toks[i:i + self.block])))
                chain.append(h)
        return chain[:n]

    # ---- queries ---------------------------------------------------------------------------
    def match(self, req) -> tuple[int, int]:
        limit = (req.prefill_len - 1) // self.page * self.page
        dev = host = 0
        for h in self._req_chain(req, limit):
            b = self.blocks.get(h)
            if b is None:
                break
            if b.on_device and not host:
                dev += 1
            elif b.on_host and self.host_capacity:
                host += 1
            else:
                break
        return dev * self.block, host * self.block

    # ---- bookkeeping -------------------------------------------------------------------------
    def _touch(self, h: int, b: _Block) -> None:
        self._tick += 1
        b.last_access = self._tick
        self._maybe_leaf(h, b)

    def _maybe_leaf(self, h: int, b: _Block) -> None:
        if b.on_device and b.lock == 0 and b.dev_children == 0:
            heapq.heappush(self._leaves, (b.last_access, h))
        elif not b.on_device and b.children == 0:
            heapq.heappush(self._host_leaves, (b.last_access, h))

    def _to_device(self, h: int, b: _Block) -> None:
        b.on_device = True
        self.tree_tokens += self.block
        if b.lock == 0:
            self.evictable += self.block
        parent = self.blocks.get(b.parent)
        if parent is not None:
            parent.dev_children += 1

    def _lock(self, h: int, b: _Block) -> None:
        if b.lock == 0 and b.on_device:
            self.evictable -= self.block
        b.lock += 1

    def _drop(self, h: int, b: _Block) -> None:
        del self.blocks[h]
        if b.on_host:
            self.host_used -= self.block
        parent = self.blocks.get(b.parent)
        if parent is not None:
            parent.children -= 1
            self._maybe_leaf(b.parent, parent)

    # ---- state changes ---------------------------------------------------------------------
    def lock(self, req) -> None:
        dev, _ = self.match(req)
        chain = self._req_chain(req, dev)
        for h in chain:
            b = self.blocks[h]
            self._lock(h, b)
            b.last_access = self._tick = self._tick + 1
        req.lock_len = len(chain)

    def unlock(self, req) -> None:
        for h in req.chain[:req.lock_len]:
            b = self.blocks.get(h)
            if b is None:
                continue
            b.lock -= 1
            if b.lock == 0 and b.on_device:
                self.evictable += self.block
            self._touch(h, b)
        req.lock_len = 0

    def _evict_one(self) -> int:
        while self._leaves:
            t, h = heapq.heappop(self._leaves)
            b = self.blocks.get(h)
            if b is None or b.last_access != t or b.lock or b.dev_children or not b.on_device:
                continue
            b.on_device = False
            self.tree_tokens -= self.block
            self.evictable -= self.block
            parent = self.blocks.get(b.parent)
            if parent is not None:
                parent.dev_children -= 1
                self._maybe_leaf(b.parent, parent)
            if b.on_host:
                self._maybe_leaf(h, b)
            else:
                self._drop(h, b)
            return self.block
        return 0

    def evict(self, tokens: int) -> int:
        freed = 0
        while freed < tokens:
            got = self._evict_one()
            if not got:
                break
            freed += got
        self.evicted_tokens += freed
        return freed

    def load_back(self, req, tokens: int) -> bool:
        dev, host = self.match(req)
        n = min(tokens, host) // self.block
        if n == 0:
            return True
        if not self.ensure_free(n * self.block):
            return False
        chain = self._req_chain(req, dev + n * self.block)
        for h in chain[dev // self.block:]:
            b = self.blocks[h]
            b.lock += 1  # locked before it counts as device: never evictable while loading
            self._to_device(h, b)
            self._touch(h, b)
        req.lock_len = len(chain)
        return True

    def _host_room(self) -> bool:
        while self.host_used + self.block > self.host_capacity and self._host_leaves:
            t, h = heapq.heappop(self._host_leaves)
            b = self.blocks.get(h)
            if b is None or b.on_device or b.children or b.last_access != t:
                continue
            self._drop(h, b)
        return self.host_used + self.block <= self.host_capacity

    def insert(self, req, total_len: int) -> int:
        """Cache the first ``total_len`` tokens of the request's sequence; the request keeps the
        inserted blocks locked. Returns the tokens of the sequence the tree now covers."""
        chain = self._req_chain(req, total_len // self.page * self.page)
        parent = 0
        for i, h in enumerate(chain):
            b = self.blocks.get(h)
            if b is None:
                b = self.blocks[h] = _Block(parent)
                b.on_device = False
                pb = self.blocks.get(parent)
                if pb is not None:
                    pb.children += 1
                if self.host_capacity and self._host_room():
                    b.on_host = True
                    self.host_used += self.block
                    self.host_written += self.block
                if i >= req.lock_len:
                    b.lock += 1
                self._to_device(h, b)
            else:
                if i >= req.lock_len:
                    self._lock(h, b)
                if not b.on_device:
                    self._to_device(h, b)
            self._touch(h, b)
            parent = h
        req.lock_len = max(req.lock_len, len(chain))
        return len(chain) * self.block
