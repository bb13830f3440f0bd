"""Figures for the notebooks and the static book: matplotlib only (renders offline as PNG).

One module per kind of picture: ``storage`` (which storage cells a view touches), ``graph``
(autograd graphs), ``memory`` (allocator timelines and segment maps), ``floats`` (bit layouts),
``ring`` (collectives), ``roofline`` (kernels). Every drawing function returns a
``matplotlib.figure.Figure`` and never calls ``plt.show()``.
"""
