# ART gather with an after_each that returns None, no backend at all
import asyncio, art
async def roll():
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=0)
async def main():
    await art.gather_trajectory_groups((art.TrajectoryGroup(roll() for _ in range(4)) for _ in range(1)),
                                       after_each=lambda g: None, pbar_desc="gather")
asyncio.run(main())
