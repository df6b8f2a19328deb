# PyTorch twin of rows_microbench.cu: softmax / log_softmax and LayerNorm / RMSNorm forward and
# backward on the same shapes, CUDA events, median of 50 (run on the GPU machine).
import torch
def med(f):
    for _ in range(5): f()
    ts=[]
    for _ in range(50):
        a=torch.cuda.Event(enable_timing=True); b=torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b)*1000)
    ts.sort(); return ts[len(ts)//2]
dt={"f32":torch.float32,"f16":torch.float16,"bf16":torch.bfloat16,"f64":torch.float64}
for t,r,c,log in [("f32",65536,1024,0),("f32",65536,1024,1),("f16",65536,1024,0),("bf16",65536,1024,0),("f64",32768,1024,0),
                  ("f32",262144,256,0),("f32",524288,128,0),("f32",65536,1000,0),("f32",65536,4096,0),("f32",131072,512,1),("f16",262144,256,1),("f32",1000,8,0)]:
    x=torch.randn(r,c,device="cuda",dtype=dt[t]); g=torch.randn_like(x)
    fn=torch.log_softmax if log else torch.softmax
    y=fn(x,1)
    bw=(lambda: torch._log_softmax_backward_data(g,y,1,x.dtype)) if log else (lambda: torch._softmax_backward_data(g,y,1,x.dtype))
    print(f"torch {t:5s} {r:6d} x {c:5d} {'log' if log else 'sm':3s} fwd {med(lambda: fn(x,1)):8.1f} us bwd {med(bw):8.1f} us")
for t,r,c,rms in [("f32",32768,1024,0),("f32",32768,1024,1),("f16",32768,1024,0),("bf16",32768,1024,0),("f32",65536,768,0),("f32",131072,256,0),("f64",32768,512,0)]:
    x=torch.randn(r,c,device="cuda",dtype=dt[t]); g=torch.randn_like(x); w=torch.randn(c,device="cuda",dtype=dt[t]); b=torch.randn_like(w)
    if rms:
        f=lambda: torch.nn.functional.rms_norm(x,(c,),w,1e-5)
        print(f"torch norm {t:5s} {r:6d} x {c:5d} rms fwd {med(f):8.1f} us")
        continue
    f=lambda: torch.nn.functional.layer_norm(x,(c,),w,b,1e-5)
    out,mean,rstd=torch.ops.aten.native_layer_norm(x,(c,),w,b,1e-5)
    bw=lambda: torch.ops.aten.native_layer_norm_backward(g,x,(c,),mean,rstd,w,b,[True,False,False])
    print(f"torch norm {t:5s} {r:6d} x {c:5d} ln  fwd {med(f):8.1f} us bwd(gx only) {med(bw):8.1f} us")
