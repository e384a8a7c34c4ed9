"""One run over several processes: shards, the merge of their rows, launch and Slurm."""
