# MLXBackend + tiny, rollouts through art.gather_trajectory_groups (tqdm), then after_each returns None
import asyncio, sys, art
from artmlx.art import MLXBackend
kw = {"run_name": "diag"} if "run_name" in art.TrainableModel.model_fields else {}
async def main():
    backend = MLXBackend(path="/tmp/art-examples/diag/.art")
    model = art.TrainableModel(name="diag", project="diag", base_model="tiny", **kw)
    await model.register(backend)
    async def roll():
        r = await model.openai_client().chat.completions.create(model=model.get_inference_name(), messages=[{"role": "user", "content": "hi"}], max_completion_tokens=8)
        return art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}, r.choices[0]], reward=0)
    await art.gather_trajectory_groups((art.TrajectoryGroup(roll() for _ in range(4)) for _ in range(1)),
                                       after_each=(lambda g: None) if sys.argv[1:] == ["none"] else None, pbar_desc="gather")
    print("gathered")
    if sys.argv[1:] == ["raise"]:
        raise RuntimeError("diag: exception escapes asyncio.run")
asyncio.run(main())
