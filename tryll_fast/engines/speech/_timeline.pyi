import numpy as np

def cues(ids: np.ndarray, durations: np.ndarray, classes: np.ndarray,
         hop: int) -> tuple[np.ndarray, np.ndarray]: ...
