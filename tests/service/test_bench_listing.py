"""bench.listing, small enough for the suite: so that the figure it gives cannot rot."""

from __future__ import annotations

import json

from bench import listing


def test_the_page_the_adapter_asks_for_is_a_sliver_of_the_whole_and_parses_to_the_same_vms(capsys):
    listing.main(["--vms", "8", "--repeat", "1"])
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    inlined, bootstrap, lean = (figures[k]["bytes"] for k in ("inlined", "bootstrap", "fields"))
    assert lean * 20 < bootstrap < inlined / 3, figures
    assert [figures[k]["vms_read"] for k in ("inlined", "bootstrap", "fields")] == [8, 8, 8]
