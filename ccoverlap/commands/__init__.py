"""The command line: one module per ``ccoverlap`` command (``register`` its flags, ``run`` it), and
:mod:`~ccoverlap.commands.options`, the flags every command spells the same way."""
