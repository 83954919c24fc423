# The codec's C-level surface for other compiled modules: the token stream encodes each
# AnswerText with a C call (tryll_fast/workflow/_stream.pyx).
from libc.stdint cimport uint64_t

cpdef bytes encode_answer_text(uint64_t request_id, uint64_t agent_id, str node_name, str text,
                               bint is_delta, bint is_final)
# (request_id, text) of an AnswerText frame, None otherwise (gateway/connection.py)
cpdef tuple answer_text_of(object frame)
