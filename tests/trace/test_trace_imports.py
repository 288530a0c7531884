"""The trace package's modules import one way: no cycle, counting imports inside functions and
under ``TYPE_CHECKING`` (a cycle there still ties the modules together for a reader and a type checker)."""

from __future__ import annotations

import grimp


def test_trace_modules_have_no_import_cycle():
    graph = grimp.build_graph("ccoverlap", include_external_packages=False, exclude_type_checking_imports=False)
    trace = sorted(m for m in graph.modules if m.startswith("ccoverlap.trace."))
    cycles = [(a, b) for a in trace for b in sorted(graph.find_modules_directly_imported_by(a))
              if b in trace and graph.chain_exists(importer=b, imported=a)]
    assert cycles == []


def test_rank_assignment_needs_no_loaded_trace_type():
    graph = grimp.build_graph("ccoverlap", include_external_packages=False, exclude_type_checking_imports=False)
    assert not graph.chain_exists(importer="ccoverlap.trace.rank_assign", imported="ccoverlap.trace.load")
