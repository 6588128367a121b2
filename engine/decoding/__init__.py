"""Token rules and the deciders (greedy, sampled, beams, n-best) and the detokenizer: numpy only."""
