"""Radix prefix cache of one KV pool, at session granularity, with an optional host tier.

Every prompt of a session extends the previous one (the conversation so far), and every session
starts with the workload's shared system prefix, so the radix tree of a pool is: one shared
system-prefix node with one branch per session. The cache therefore only needs, per session, how
many tokens of its conversation are cached (a prefix), page-aligned. Eviction follows SGLang's
LRU over leaves: a session's branch is touched as a whole, so the least recently used unlocked
branch loses tokens from its tail first. The shared prefix is an inner node touched by every
request and is never the LRU leaf while any branch exists; it is kept.

With the hierarchical cache (write-through), every inserted token is also in the host pool; device
eviction only drops the device copy. The host pool evicts host-only tokens (LRU) when full. A match
then finds ``device`` tokens on the GPU and ``host - device`` more to load back over the host link.
"""

from __future__ import annotations

from collections import OrderedDict


class SessionPrefixCache:
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
        self.evictable = 0  # tokens of unlocked branches
        self.alloc_tokens = 0  # tokens held by running requests outside the tree
        self.host_capacity = host_capacity_tokens
        self.host: dict[int, int] = {}
        self.host_lru: OrderedDict[int, None] = OrderedDict()
        self.host_used = 0
        self.evicted_tokens = 0

    # ---- queries ---------------------------------------------------------------------------
    def free(self) -> int:
        return self.capacity - self.tree_tokens - self.alloc_tokens

    def match(self, session: int, prompt_len: int) -> tuple[int, int]:
        """(tokens on the device, tokens more on the host) of the prompt's cached prefix."""
        if not self.sys_cached:
            return 0, 0
        limit = (prompt_len - 1) // self.page * self.page  # at least one token is always computed
        dev = min(self.sys_len + self.branch.get(session, 0), limit)
        host = 0
        if self.host_capacity:
            host = max(0, min(self.sys_len + self.host.get(session, 0), limit) - dev)
        return dev, host

    # ---- state changes ---------------------------------------------------------------------
    def lock(self, session: int) -> None:
        if session in self.lru:
            del self.lru[session]
            self.evictable -= self.branch.get(session, 0)
        self.locked.add(session)

    def unlock(self, session: int) -> None:
        if session in self.locked:
            self.locked.discard(session)
            if self.branch.get(session, 0):
                self.lru[session] = None
                self.evictable += self.branch[session]

    def evict(self, tokens: int) -> int:
        """Free at least ``tokens`` (LRU unlocked branches, tail first); returns tokens freed."""
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
            self.evictable -= take
        self.evicted_tokens += freed
        return freed

    def ensure_free(self, tokens: int) -> bool:
        """Evict until ``tokens`` are free; False when even evicting everything is not enough."""
        short = tokens - self.free()
        if short <= 0:
            return True
        if short > self.evictable:
            return False
        self.evict(short)
        return True

    def insert(self, session: int, total_len: int) -> None:
        """Cache ``total_len`` tokens of the session (system prefix included), page-aligned.
        The session must be locked; the caller frees the request's own allocation."""
        aligned = total_len // self.page * self.page
        if not self.sys_cached and aligned >= self.sys_len:
            self.sys_cached = True
            self.tree_tokens += self.sys_len
        new_branch = max(0, aligned - self.sys_len) if self.sys_cached else 0
        old = self.branch.get(session, 0)
        if new_branch > old:
            self.branch[session] = new_branch
            self.tree_tokens += new_branch - old
        if self.host_capacity and self.sys_cached:
            self._host_insert(session, new_branch)

    def _host_insert(self, session: int, length: int) -> None:
        old = self.host.get(session, 0)
        if length > old:
            self.host[session] = length
            self.host_used += length - old
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
