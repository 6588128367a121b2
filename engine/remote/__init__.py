"""The engine in a process of its own: the msgpack wire, the host, its front end and what watches it."""
