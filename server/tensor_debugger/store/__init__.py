"""Where things are kept: the metadata database and its models, the Zarr arrays (layout, chunk reader and writer),
dtypes, the catalog of sessions, runs and tensors, and their JSON shapes."""
