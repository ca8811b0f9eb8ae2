"""Request media -> model-ready frames, off the event loop and within budgets: bodies and media
parsed and decoded in worker processes (decoding, decode_pool), videos and images (video,
images), server-local files (paths), the decoded-memory budget (decoded_budget) and memory
given back after large episodes (memory_release)."""
