"""From files a user hands over to stored runs: archives, inputs, tensor files, module traces, summaries, the array
writer, the ingest queue and recovery of interrupted ingests."""
