"""The research codecs, one file each."""
