"""Trace-driven replay: rebuild a measured step's dependency graph from its Kineto traces
(:mod:`.graph`), join the ranks and replay it (:mod:`.job`), measure it with the
analyser's own code (:mod:`.core`), ask what-ifs as graph edits (:mod:`.whatif`), and report
(:mod:`.run`, :mod:`.report`). Entry point: :func:`ccoverlap.replayer.run.replay`. No torch.
"""
