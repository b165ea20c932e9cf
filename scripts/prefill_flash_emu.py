#!/usr/bin/env python3
# Lane-level numpy emulation of FlashPrefillKernel (src/kernels/cuda/prefill_flash.cu): the same index
# expressions per lane, with mma.m16n8k16 / ldmatrix(.trans) fragments as the PTX ISA documents them, against a
# plain softmax reference over a shuffled paged cache. A design check of the fragment bookkeeping that runs
# without a GPU (it does not model cp.async or barriers); keep it in step with the kernel when that changes.
# Usage: python3 scripts/prefill_flash_emu.py   (~10 s of CPU; prints rel-L2 per case, ~1e-3 from the bf16 P)
# Lane-level emulation of FlashPrefillKernel (prefill_flash.cu) with PTX-documented fragment layouts,
# to catch indexing bugs before the GPU run. bf16 rounding ignored (fp32 everywhere) except P packing.
import numpy as np, math
kKeys=64; PAD=8

def bf16(x):
    x=np.asarray(x,dtype=np.float32); u=x.view(np.uint32).astype(np.uint64)
    u=((u+0x7fff+((u>>16)&1))>>16)<<16
    return u.astype(np.uint32).view(np.float32)

# fragments: a "register" = tuple of 2 values (lo, hi)
def mma(d, a, b0, b1):
    # a: list of 4 regs per lane -> A[16][16]; b: regs per lane -> B[16][8]; d: per lane 4 floats
    A=np.zeros((16,16)); B=np.zeros((16,8))
    for lane in range(32):
        g,t=lane>>2,lane&3
        for (r,c),reg in zip([(g,2*t),(g+8,2*t),(g,2*t+8),(g+8,2*t+8)], a[lane]):
            A[r,c],A[r,c+1]=reg
        B[2*t,g],B[2*t+1,g]=b0[lane]; B[2*t+8,g],B[2*t+9,g]=b1[lane]
    C=A@B
    for lane in range(32):
        g,t=lane>>2,lane&3
        d[lane][0]+=C[g,2*t]; d[lane][1]+=C[g,2*t+1]; d[lane][2]+=C[g+8,2*t]; d[lane][3]+=C[g+8,2*t+1]

def ldmatrix_x4(smem, addr, trans):
    # addr[lane] = (row, col) element index into smem (2D array); matrix i rows from lanes 8i..8i+7
    out=[[None]*4 for _ in range(32)]
    for i in range(4):
        M=np.array([smem[addr[8*i+r][0], addr[8*i+r][1]:addr[8*i+r][1]+8] for r in range(8)])
        if trans: M=M.T
        for lane in range(32):
            out[lane][i]=(M[lane>>2, 2*(lane&3)], M[lane>>2, 2*(lane&3)+1])
    return out

def kernel(HD, q, kc, vc, cu, sp, tables, heads, kvh, bs, scale, kKByLdMatrix=True, W=4):
    kRows=16*W; stride=HD+PAD; out=np.full(q.shape, np.nan)
    num_seqs=len(sp); total=cu[-1]
    slots=total//kRows+num_seqs
    for head in range(heads):
      for y in range(slots):
        seq=-1; tile=0; slot=y
        for s in range(num_seqs):
            ln=cu[s+1]-cu[s]; tiles=(ln+kRows-1)//kRows
            if slot<tiles: seq=s; tile=tiles-1-slot; break
            slot-=tiles
        if seq<0: continue
        tok0=cu[seq]; ln=cu[seq+1]-tok0; start=sp[seq]; q0=tile*kRows; rows=min(kRows, ln-q0)
        kv_end=start+q0+rows; nkv=(kv_end+kKeys-1)//kKeys; kv_head=head//(heads//kvh)
        table=tables[seq]
        sq=np.zeros((kRows,stride))
        for r in range(rows): sq[r,:HD]=q[tok0+q0+r, head]
        def load(kt):
            K=np.zeros((kKeys,stride)); V=np.zeros((kKeys,stride))
            for r in range(kKeys):
                p=kt*kKeys+r
                if p<kv_end:
                    sl=table[p//bs]*bs+p%bs
                    K[r,:HD]=kc[sl,kv_head]; V[r,:HD]=vc[sl,kv_head]
            return K,V
        tile_min_pos=start+q0
        st=[]  # per warp state
        for w in range(W):
            lanes=[]
            for lane in range(32):
                g,t=lane>>2,lane&3; row0=w*16+g
                qa=[]
                for ks in range(HD//16):
                    c=ks*16+2*t
                    qa.append([(sq[row0,c],sq[row0,c+1]),(sq[row0+8,c],sq[row0+8,c+1]),(sq[row0,c+8],sq[row0,c+9]),(sq[row0+8,c+8],sq[row0+8,c+9])])
                lanes.append(dict(row0=row0,pos0=start+q0+row0,pos1=start+q0+row0+8,m0=-math.inf,m1=-math.inf,l0=0.,l1=0.,o=[[0.]*4 for _ in range(HD//8)],qa=qa))
            st.append(lanes)
        for kt in range(nkv):
            ck,cv=load(kt)
            key0=kt*kKeys; need_mask=key0+kKeys-1>tile_min_pos
            for w in range(W):
                L=st[w]
                s=[[[0.]*4 for _ in range(8)] for _ in range(32)]  # s[lane][n][e]
                if kKByLdMatrix:
                    for ks in range(0,HD//16,2):
                        for n in range(8):
                            addr=[((lane&7)+n*8, (lane>>3)*8+ks*16) for lane in range(32)]
                            b=ldmatrix_x4(ck,addr,False)
                            dn=[s[l][n] for l in range(32)]
                            mma(dn,[L[l]['qa'][ks] for l in range(32)],[b[l][0] for l in range(32)],[b[l][1] for l in range(32)])
                            mma(dn,[L[l]['qa'][ks+1] for l in range(32)],[b[l][2] for l in range(32)],[b[l][3] for l in range(32)])
                else:
                    for ks in range(HD//16):
                        for n in range(8):
                            b0=[];b1=[]
                            for lane in range(32):
                                g,t=lane>>2,lane&3; r=n*8+g; c=ks*16+2*t
                                b0.append((ck[r,c],ck[r,c+1])); b1.append((ck[r,c+8],ck[r,c+9]))
                            mma([s[l][n] for l in range(32)],[L[l]['qa'][ks] for l in range(32)],b0,b1)
                # mask/scale/softmax per lane
                mx0=[0]*32; mx1=[0]*32
                for lane in range(32):
                    t=lane&3; P=L[lane]
                    for n in range(8):
                        for e in range(4):
                            x=s[lane][n][e]*scale*1.4426950408889634
                            if need_mask:
                                key=key0+n*8+2*t+(e&1); pos=P['pos0'] if e<2 else P['pos1']
                                if key>pos or key>=kv_end: x=-math.inf
                            s[lane][n][e]=x
                    mx0[lane]=max(max(s[lane][n][0],s[lane][n][1]) for n in range(8))
                    mx1[lane]=max(max(s[lane][n][2],s[lane][n][3]) for n in range(8))
                for off in (1,2):
                    mx0=[max(mx0[l],mx0[l^off]) for l in range(32)]
                    mx1=[max(mx1[l],mx1[l^off]) for l in range(32)]
                pa_all=[]
                for lane in range(32):
                    P=L[lane]
                    mn0=max(P['m0'],mx0[lane]); mn1=max(P['m1'],mx1[lane])
                    b0_=0. if mn0==-math.inf else mn0; b1_=0. if mn1==-math.inf else mn1
                    c0=2**(P['m0']-b0_); c1=2**(P['m1']-b1_)
                    P['m0']=mn0;P['m1']=mn1; sum0=sum1=0.
                    for n in range(8):
                        s[lane][n][0]=2**(s[lane][n][0]-b0_); s[lane][n][1]=2**(s[lane][n][1]-b0_)
                        s[lane][n][2]=2**(s[lane][n][2]-b1_); s[lane][n][3]=2**(s[lane][n][3]-b1_)
                        sum0+=s[lane][n][0]+s[lane][n][1]; sum1+=s[lane][n][2]+s[lane][n][3]
                    P['l0']=P['l0']*c0+sum0; P['l1']=P['l1']*c1+sum1
                    for d in P['o']:
                        d[0]*=c0;d[1]*=c0;d[2]*=c1;d[3]*=c1
                    sl=s[lane]; pk=lambda a,b:(float(bf16(a)),float(bf16(b)))
                    pa_all.append([[pk(sl[2*j][0],sl[2*j][1]),pk(sl[2*j][2],sl[2*j][3]),pk(sl[2*j+1][0],sl[2*j+1][1]),pk(sl[2*j+1][2],sl[2*j+1][3])] for j in range(4)])
                for j in range(4):
                    for dp in range(HD//16):
                        addr=[(j*16+(lane&7)+((lane>>3)&1)*8, (lane>>4)*8+dp*16) for lane in range(32)]
                        b=ldmatrix_x4(cv,addr,True)
                        pa=[pa_all[l][j] for l in range(32)]
                        mma([L[l]['o'][2*dp] for l in range(32)],pa,[b[l][0] for l in range(32)],[b[l][1] for l in range(32)])
                        mma([L[l]['o'][2*dp+1] for l in range(32)],pa,[b[l][2] for l in range(32)],[b[l][3] for l in range(32)])
        for w in range(W):
            L=st[w]
            l0=[L[l]['l0'] for l in range(32)]; l1=[L[l]['l1'] for l in range(32)]
            for off in (1,2):
                l0=[l0[l]+l0[l^off] for l in range(32)]; l1=[l1[l]+l1[l^off] for l in range(32)]
            for lane in range(32):
                t=lane&3; P=L[lane]; row0=P['row0']
                i0=1/l0[lane] if l0[lane]>0 else 0; i1=1/l1[lane] if l1[lane]>0 else 0
                for d in range(HD//8):
                    c=d*8+2*t
                    if row0<rows: out[tok0+q0+row0,head,c:c+2]=[P['o'][d][0]*i0,P['o'][d][1]*i0]
                    if row0+8<rows: out[tok0+q0+row0+8,head,c:c+2]=[P['o'][d][2]*i1,P['o'][d][3]*i1]
    return out

def reference(q,kc,vc,cu,sp,tables,heads,kvh,bs,scale):
    out=np.zeros(q.shape)
    for s in range(len(sp)):
        for i in range(cu[s+1]-cu[s]):
            pos=sp[s]+i
            for h in range(heads):
                kh=h//(heads//kvh)
                sl=[tables[s][p//bs]*bs+p%bs for p in range(pos+1)]
                K=kc[sl,kh]; V=vc[sl,kh]
                x=K@q[cu[s]+i,h]*scale; x=np.exp(x-x.max()); out[cu[s]+i,h]=(x/x.sum())@V
    return out

rng=np.random.default_rng(0)
for HD,bs,ldm,W in [(64,8,True,4),(64,16,False,4),(128,32,True,4),(64,16,True,8)]:
    heads,kvh=4,2
    chunks=[70,3,1] if W==4 else [150,3]; starts=[5,0,77][:len(chunks)]
    lens=[a+b for a,b in zip(chunks,starts)]
    cu=[0]
    for c in chunks: cu.append(cu[-1]+c)
    maxb=max((l+bs-1)//bs for l in lens); nb=maxb*len(lens)+3
    perm=rng.permutation(nb); tables=[]; nxt=0
    for l in lens:
        row=[0]*maxb
        for b in range((l+bs-1)//bs): row[b]=int(perm[nxt]); nxt+=1
        tables.append(row)
    kc=rng.uniform(-1,1,(nb*bs,kvh,HD)); vc=rng.uniform(-1,1,(nb*bs,kvh,HD))
    q=rng.uniform(-2,2,(cu[-1],heads,HD)); scale=1/math.sqrt(HD)
    got=kernel(HD,q,kc,vc,cu,starts,tables,heads,kvh,bs,scale,ldm,W)
    want=reference(q,kc,vc,cu,starts,tables,heads,kvh,bs,scale)
    print('hd',HD,'bs',bs,'ldmatrix_k',ldm,'warps',W,'nan',np.isnan(got).sum(),'rel_l2',np.linalg.norm(np.nan_to_num(got)-want)/np.linalg.norm(want))
