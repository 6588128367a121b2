"""The step: the scheduler picks rows, the runtime runs them, decoding chooses tokens, outputs report."""
