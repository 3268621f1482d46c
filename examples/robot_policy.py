"""A vision-language-action style robot policy of about 300M parameters, in bfloat16: a
16x16 patch embedding of a 224x224 camera frame (196 patches), a language instruction of 16
tokens and the robot's proprioceptive state, a 24-layer transformer (width 1024) over all of
them, and an action head that emits a chunk of 8 future actions of 7 degrees of freedom.

    solbound provision examples/robot_policy.py --rate 500 --arch jetson-thor,jetson-orin,b200
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, HEADS, LAYERS, FFN = 1024, 16, 24, 4096
PATCH, IMAGE, TEXT, VOCAB, STATE = 16, 224, 16, 32000, 14
CHUNK, DOF = 8, 7


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.norm2 = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, FFN)
        self.fc2 = nn.Linear(FFN, DIM)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, DIM // HEADS).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, DIM))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, DIM, PATCH, stride=PATCH)
        self.pos = nn.Parameter(torch.zeros(1, (IMAGE // PATCH) ** 2 + TEXT + 1, DIM))
        self.embed = nn.Embedding(VOCAB, DIM)
        self.state = nn.Linear(STATE, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CHUNK * DOF)
        self.to(torch.bfloat16)

    def forward(self, image, instruction, state):
        img = self.patch(image).flatten(2).transpose(1, 2)               # (b, 196, DIM)
        x = torch.cat([img, self.embed(instruction), self.state(state)[:, None]], 1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x[:, -1])).view(-1, CHUNK, DOF)      # from the state token


def get_inputs():
    return [torch.randn(1, 3, IMAGE, IMAGE, dtype=torch.bfloat16),
            torch.randint(0, VOCAB, (1, TEXT)),
            torch.randn(1, STATE, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
