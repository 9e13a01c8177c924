"""Who entered which collective at a site (wangate.gateway.claims): a second trainer of
one job entering the same call collides; a connection's claims end with it; each job
has its own claims and remembers its last ``MAX_CLAIMS`` of them."""

from __future__ import annotations

import pytest

from wangate.errors import ErrorCode, GatewayError
from wangate.gateway.claims import MAX_CLAIMS, CollectiveClaims
from wangate.service import Claimant

A = Claimant(1, 4711)  # connection 1, in process 4711
B = Claimant(2, 4712)
A_AGAIN = Claimant(1, 4711)


def collision(claims: CollectiveClaims, job: str, call: str, step: int, by: Claimant) -> str:
    with pytest.raises(GatewayError) as refused:
        claims.claim(job, call, step, by)
    assert refused.value.code == ErrorCode.COLLISION
    return str(refused.value)


def test_a_claim_is_held_and_the_same_connection_may_claim_it_again() -> None:
    claims = CollectiveClaims()
    claims.claim("default", "allreduce/ddp.b0", 3, A)
    assert claims.count("default") == 1
    claims.claim("default", "allreduce/ddp.b0", 3, A_AGAIN)  # a retry: still its own
    assert claims.count("default") == 1
    claims.claim("default", "allreduce/ddp.b0", 4, A)  # the next step is another call
    claims.claim("default", "broadcast/ddp.b0", 3, A)  # so is another kind with the tag
    assert claims.count("default") == 3


def test_another_connection_collides_and_is_told_who_holds_the_call() -> None:
    claims = CollectiveClaims()
    claims.claim("llama-run3", "allreduce/ddp.b0", 3, A)
    assert collision(claims, "llama-run3", "allreduce/ddp.b0", 3, B) == (
        "collision: allreduce 'ddp.b0' at step 3 in job 'llama-run3' was entered at this "
        "site by another trainer (pid 4711); two trainers of one job at one site may not "
        "enter the same collective"
    )
    # a process that opened a second connection is another trainer too
    again = collision(claims, "llama-run3", "allreduce/ddp.b0", 3, Claimant(3, 4711))
    assert "(pid 4711)" in again
    claims.claim("llama-run3", "allreduce/ddp.b0", 3, A)  # the holder still holds it
    assert claims.count("llama-run3") == 1
    # a collision takes nothing: B holds no claim of its own now
    claims.release(A.connection)
    assert claims.count("llama-run3") == 0


def test_barrier_and_broadcast_collisions_name_their_kind_and_tag() -> None:
    claims = CollectiveClaims()
    claims.claim("default", "barrier/epoch.end", 0, A)
    claims.claim("default", "broadcast/weights", 2**63 - 1, A)
    assert collision(claims, "default", "barrier/epoch.end", 0, B).startswith(
        "collision: barrier 'epoch.end' at step 0 in job 'default' was entered"
    )
    assert collision(claims, "default", "broadcast/weights", 2**63 - 1, B).startswith(
        f"collision: broadcast 'weights' at step {2**63 - 1} in job 'default' was entered"
    )


def test_a_connection_closing_frees_its_claims_and_only_its_own() -> None:
    claims = CollectiveClaims()
    claims.claim("default", "allreduce/g", 1, A)
    claims.claim("default", "allreduce/g", 2, A)
    claims.claim("other", "allreduce/g", 1, A)
    claims.claim("default", "allreduce/h", 1, B)
    claims.release(A.connection)
    assert claims.count("default") == 1 and claims.count("other") == 0
    claims.claim("default", "allreduce/g", 1, B)  # free now
    claims.claim("other", "allreduce/g", 1, B)
    collision(claims, "default", "allreduce/h", 1, A)  # B's stays B's
    claims.release(B.connection)
    assert claims.count("default") == claims.count("other") == 0
    claims.release(B.connection)  # twice, or a connection that claimed nothing: no-op
    claims.release(99)
    claims.claim("default", "allreduce/h", 1, A)


def test_jobs_are_independent() -> None:
    claims = CollectiveClaims()
    claims.claim("llama-run3", "allreduce/ddp.b0", 3, A)
    claims.claim("eval", "allreduce/ddp.b0", 3, B)  # same call and step, another job
    claims.claim("default", "allreduce/ddp.b0", 3, Claimant(3, 4713))
    assert [claims.count(j) for j in ("llama-run3", "eval", "default")] == [1, 1, 1]
    assert "in job 'eval'" in collision(claims, "eval", "allreduce/ddp.b0", 3, A)
    assert claims.count("nobody") == 0


def test_each_job_remembers_its_last_max_claims_and_forgets_the_oldest_first() -> None:
    assert MAX_CLAIMS == 65536
    claims = CollectiveClaims()
    claims.claim("other", "allreduce/g", 0, A)  # another job's claims are not evicted
    for step in range(MAX_CLAIMS):
        claims.claim("default", "allreduce/g", step, A)
    assert claims.count("default") == MAX_CLAIMS
    claims.claim("default", "allreduce/g", 0, A)  # claimed again: the newest now
    claims.claim("default", "allreduce/g", MAX_CLAIMS, A)  # one more: step 1 goes
    assert claims.count("default") == MAX_CLAIMS
    claims.claim("default", "allreduce/g", 1, B)  # forgotten: no collision; step 2 goes
    assert claims.count("default") == MAX_CLAIMS
    collision(claims, "default", "allreduce/g", 0, B)  # still remembered
    collision(claims, "default", "allreduce/g", 3, B)
    claims.claim("default", "allreduce/g", 2, B)  # forgotten in its turn; step 3 goes
    claims.claim("default", "allreduce/g", 3, B)  # and step 4 goes
    collision(claims, "default", "allreduce/g", 5, B)
    collision(claims, "default", "allreduce/g", MAX_CLAIMS, B)
    collision(claims, "other", "allreduce/g", 0, B)
    assert claims.count("other") == 1
