"""Planning a comparison: the pairs of a session (planned, paired by hand or by a pairing file, explored) and
the compare a user asks for."""
