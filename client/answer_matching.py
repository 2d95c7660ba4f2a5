"""A broker's per-item results matched to the items asked: an admin request names
topics, groups or partitions, and its answer must say what became of each. A result
for an item not asked is ignored; an item the answer leaves out is not a success (as
Kafka's AdminClient fails it: "the server response did not contain a reference to
...") but an error that names it, because it may or may not have been done."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Iterable
from typing import TypeVar

from client.errors import UnknownServerError

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


def results_by_item(
    asked: Iterable[K], results: Iterable[R], key: Callable[[R], K]
) -> tuple[dict[K, R], list[K]]:
    """({item: its result} for the items asked that the answer covers (the first
    result of each), [the items asked that it leaves out], in the order asked)."""
    wanted = list(dict.fromkeys(asked))
    pending = set(wanted)
    found: dict[K, R] = {}
    for result in results:
        item = key(result)
        if item in pending:
            found[item] = result
            pending.discard(item)
    return found, [item for item in wanted if item not in found]


def missing_result(what: str, item: object, request: str) -> UnknownServerError:
    """The error for an item the broker's answer left out."""
    return UnknownServerError(
        f"the {request} answer has no result for {what} {item}: it may or may not have "
        f"been done (look before retrying)"
    )


def result_for_each(
    asked: Iterable[K], results: Iterable[R], key: Callable[[R], K], *, what: str, request: str
) -> list[R]:
    """The result of each item asked, in the order asked; raises missing_result for
    the first item the answer leaves out."""
    wanted = list(dict.fromkeys(asked))
    found, missing = results_by_item(wanted, results, key)
    if missing:
        raise missing_result(what, missing[0], request)
    return [found[item] for item in wanted]
