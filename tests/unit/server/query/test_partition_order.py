"""`in_partition_order` (server/query/engine.py): a result's batches, arriving partition by partition in
completion order, come out in partition order, each as early as the order allows."""
from hypothesis import given, strategies as st

from iox_spark.server.query.engine import in_partition_order


@st.composite
def _arrivals(draw):
    """(partitions [[batch]], the completion order of the non-empty ones)."""
    sizes = draw(st.lists(st.integers(0, 3), min_size=0, max_size=8))
    parts = [[(p, i) for i in range(n)] for p, n in enumerate(sizes)]
    order = draw(st.permutations([p for p, n in enumerate(sizes) if n]))
    return parts, order


@given(_arrivals())
def test_batches_come_out_in_partition_order(arrival):
    parts, order = arrival
    tagged = [(p, b) for p in order for b in parts[p]]
    assert list(in_partition_order(iter(tagged))) == [b for bs in parts for b in bs]


@given(_arrivals())
def test_each_batch_goes_out_as_soon_as_every_earlier_partition_is_done(arrival):
    """A batch is yielded before the next arrival is read when its partition is due: every earlier
    partition has arrived completely (the partition arriving after a partition is proof it is done)."""
    parts, order = arrival
    tagged = [(p, b) for p in order for b in parts[p]]
    read = []

    def source():
        for t in tagged:
            read.append(t)
            yield t

    out = in_partition_order(source())
    emitted = []
    for b in out:
        emitted.append((b, len(read)))
    for (p, i), n_read in emitted:
        arrived_at = tagged.index((p, (p, i))) + 1
        earlier = [q for q in range(p) if parts[q]]
        # every earlier non-empty partition is done once a later arrival follows its last batch
        done_at = max([max(tagged.index((q, b)) for b in parts[q]) + 2 for q in earlier], default=0)
        last_arrival = len(tagged)
        if any(not parts[q] for q in range(p)):  # an empty partition before it: known only at the end
            continue
        assert n_read <= max(arrived_at, min(done_at, last_arrival)), (p, i, n_read, tagged)


def test_nothing_in_nothing_out():
    assert list(in_partition_order(iter(()))) == []
