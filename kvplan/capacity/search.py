"""The searches over one KV pool: the most users within a budget, the longest context for N users."""

from kvplan.engines import KVPool
from kvplan.errors import KvplanError

SEARCH_LIMIT = 1 << 24  # longest context searched for models that state no maximum

UNBOUNDED_USERS = 2**40  # a count no GPU serves; fitting this many means the pool does not grow with users


def max_users(pool: KVPool, budget: int, ctx: int, prefix: int = 0, steady: bool = False) -> int:
    """The largest N with pool.peak_bytes(N, ctx) <= budget (0 if not even one fits); `steady`: counting what
    the users hold in steady decode rather than what the engine reserves to admit them. The pool's own count
    where it has one (`KVPool.users_within`: vLLM's blocks are linear in users), else `search_users`."""
    exact = pool.users_within(budget, ctx, prefix, steady)
    return exact if exact is not None else search_users(pool, budget, ctx, prefix, steady)


def search_users(pool: KVPool, budget: int, ctx: int, prefix: int = 0, steady: bool = False) -> int:
    """`max_users` by search, for any pool whose peak grows with N. It starts at budget // peak_bytes(1), where
    pools linear in N (most) already have the answer, and gallops from there to a bracket, peak_bytes(low) <=
    budget < peak_bytes(high), before bisecting it."""
    def peak(users: int) -> int:
        return pool.peak_bytes(users, ctx, prefix, steady)

    one = peak(1)
    if one > budget:
        return 0
    if peak(UNBOUNDED_USERS) <= budget:  # users cost nothing: the search would not end
        raise KvplanError(f"at {ctx:,} tokens users need no KV memory of their own, so there is no user limit")
    guess = max(1, budget // one) if one > 0 else 1
    if peak(guess) <= budget:
        low, step = guess, 1
        while peak(low + step) <= budget:
            low, step = low + step, step * 2
        high = low + step
    else:
        high, step = guess, 1
        while high - step > 1 and peak(high - step) > budget:
            high, step = high - step, step * 2
        low = max(1, high - step)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if peak(mid) <= budget else (low, mid)
    return low


def max_ctx(pool: KVPool, budget: int, users: int, limit: int, prefix: int = 0) -> int:
    """The largest ctx in [max(1, prefix), limit] at which `users` are served (0 if none): the engine starts
    with max_model_len ctx (one request's reservation fits) and the users' steady-decode hold fits. The pool's own
    count decides where it has one (SGLang's Mamba split serves fewer users just past a budget that adds a slot)."""
    def serves(count: int, ctx: int, steady: bool = False) -> bool:
        counted = pool.users_within(budget, ctx, prefix, steady)
        return counted >= count if counted is not None else pool.peak_bytes(count, ctx, prefix, steady) <= budget

    def fits(ctx: int) -> bool:
        return serves(1, ctx) and serves(users, ctx, True)

    if capped(pool, users, budget) < users:
        return 0
    low = max(1, prefix)
    if not fits(low):
        return 0
    high = limit + 1
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def capped(pool: KVPool, users: int, budget: int) -> int:
    """Users one engine instance serves: those that fit, at most its sequence limit for this budget."""
    limit = pool.sequence_limit(budget)
    return users if limit is None else min(users, limit)
