"""From stored runs to results: the plan of pairs, pending pairs computed through the engine (and the compiled chunk
loop), the worker, reports, slices, the inspector and heatmaps."""
