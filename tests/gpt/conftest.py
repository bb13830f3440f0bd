"""The capstone's tests run torch single-threaded: their models are tiny, and on a shared 2-core machine
two intra-op threads that wait for each other are several times slower than one."""
import torch

torch.set_num_threads(1)
