"""Computing pending pairs: set up in batches, compared through the engine (and the compiled chunk loop), locally
or on a Dask cluster, early while runs ingest, in the background worker."""
