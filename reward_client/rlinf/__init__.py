"""The client's RLinf side: the hook inside an env object, judging, asynchronous placement, dense
rewards, canaries, the live audit and the env adapters. Imported inside RLinf's env workers."""
