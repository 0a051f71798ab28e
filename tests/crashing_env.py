"""A user environment that raises in every actor (its constructor works, its reset does not)."""


class CrashingEnv:
    name = "crashing"
    outcomes = ("win",)

    def reset(self, seed):
        raise RuntimeError("this environment always fails in reset()")

    def step(self, text):
        raise RuntimeError("unreachable")
